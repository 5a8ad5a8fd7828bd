"""The main commands, one module each with ``main(argv) -> int`` and ``console()`` (the console script: ``main``
under :func:`regulargpt.cli.run`, so a user error is one line and exit status 2). The top layer: it may import
everything below it; nothing imports it.

    regulargpt-pretrain      = python launch/pretrain.py        (commands/pretrain.py)
    regulargpt-train-formal  = python launch/train_formal.py    (commands/train_formal.py)
    regulargpt-extrapolate   = python eval/extrapolate.py       (commands/extrapolate.py)
    regulargpt-generate      = python launch/generate.py        (commands/generate.py)
    regulargpt-formal        = python eval/formal.py            (commands/formal_suite.py)
    regulargpt-export        = python launch/export.py          (commands/export.py)
    regulargpt-submit        = python launch/submit.py          (commands/submit.py)

The scripts stay as thin wrappers (``deepspeed launch/pretrain.py --config …`` needs a file; checkouts run without
``pip install -e .``); console scripts appear after ``pip install -e .``.
"""
