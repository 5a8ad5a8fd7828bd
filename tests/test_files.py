"""The one reading policy for JSON and JSONL files (regulargpt/files.py), checked on hand-written files.

Policy: a JSONL last line without its newline was torn by a crash mid-write and is dropped with a TornLineWarning;
any other line that is not JSON is an error naming the file and the line. Every reader of result rows follows it.
"""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from regulargpt.config import ConfigError, load_config
from regulargpt.evaluation.formal_scoring import read_rows
from regulargpt.evaluation.length_sweep import ResultsFile
from regulargpt.evaluation.lm_report import load_rows
from regulargpt.files import CorruptFileError, TornLineWarning, atomic_savefig, read_json_object, read_jsonl

GOOD = b'{"length": 16, "n": 1}\n{"length": 32, "n": 2}\n'
ROWS = [{"length": 16, "n": 1}, {"length": 32, "n": 2}]

READERS: dict[str, Callable[[Path], list[Any]]] = {
    "read_jsonl": read_jsonl,
    "ResultsFile": lambda path: ResultsFile(path, repair=False).rows,
    "lm_report.load_rows": load_rows,
    "formal.read_rows": lambda path: list(read_rows(path).values()),
}


@pytest.mark.parametrize("reader", READERS)
def test_good_file_reads_every_row(reader: str, tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_bytes(GOOD + b"\n")  # a blank line is not a row
    assert READERS[reader](path) == ROWS


@pytest.mark.parametrize("reader", READERS)
def test_torn_last_line_is_dropped_with_a_warning(reader: str, tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_bytes(GOOD + b'{"length": 64, "n')
    with pytest.warns(TornLineWarning, match=r"rows\.jsonl: dropped a torn last line \(17 bytes"):
        assert READERS[reader](path) == ROWS
    assert path.read_bytes().endswith(b'"n')  # a reader never writes


@pytest.mark.parametrize("reader", READERS)
def test_bad_middle_line_is_an_error_naming_file_and_line(reader: str, tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"length": 16, "n": 1}\n{"length": 3\n{"length": 32, "n": 2}\n')
    with pytest.raises(CorruptFileError, match=r"rows\.jsonl: line 2 is not JSON"):
        READERS[reader](path)


def test_a_complete_last_line_that_is_not_json_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_bytes(GOOD + b"{oops}\n")  # it has its newline: not torn by a crash
    with pytest.raises(CorruptFileError, match="line 3 is not JSON"):
        read_jsonl(path)


def test_repair_cuts_the_torn_line_off_so_the_next_append_is_clean(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_bytes(GOOD + b'{"len')
    with pytest.warns(TornLineWarning, match="cut it off"):
        results = ResultsFile(path)
    results.append({"length": 64, "n": 3})
    assert path.read_bytes() == GOOD + b'{"length": 64, "n": 3}\n'


def test_missing_jsonl_is_empty_but_a_missing_results_file_is_an_error(tmp_path: Path) -> None:
    assert read_jsonl(tmp_path / "none.jsonl") == [] and ResultsFile(tmp_path / "none.jsonl").rows == []
    with pytest.raises(FileNotFoundError, match="none.jsonl"):
        load_rows(tmp_path / "none.jsonl")


@pytest.mark.parametrize(("body", "message"), [
    (b'{"a": 1,}', r"x\.json: malformed JSON at line 1, column 9"),
    (b"[1, 2]", r"x\.json: top level must be a JSON object"),
    (b'{"a": "\xff"}', r"x\.json: not UTF-8 text \(byte 7\)"),
])
def test_json_object_errors_name_file_and_problem(body: bytes, message: str, tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_bytes(body)
    with pytest.raises(CorruptFileError, match=message + ".*; hint$"):
        read_json_object(path, hint="hint")
    with pytest.raises(ConfigError, match=message):  # configs are read by the same function
        load_config(path)


def test_json_object_reads_an_object_and_names_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text('{"a": [1, 2]}')
    assert read_json_object(path) == {"a": [1, 2]}
    with pytest.raises(ConfigError, match=r"nope\.json: config file not found"):
        read_json_object(tmp_path / "nope.json", ConfigError, kind="config file")


def test_plots_are_written_atomically_with_the_bytes_savefig_writes(tmp_path: Path) -> None:
    matplotlib = pytest.importorskip("matplotlib", reason="plots are optional; this checks how they are written")

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1, 4])
    fig.savefig(tmp_path / "direct.png", dpi=50)
    atomic_savefig(fig, tmp_path / "plot.png", dpi=50)
    assert (tmp_path / "plot.png").read_bytes() == (tmp_path / "direct.png").read_bytes()

    def crash(*args: object, **kwargs: object) -> None:
        args[0].write(b"\x89PNG half")  # type: ignore[attr-defined]
        raise RuntimeError("killed mid-plot")

    fig.savefig = crash  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="mid-plot"):
        atomic_savefig(fig, tmp_path / "plot.png", dpi=50)
    assert (tmp_path / "plot.png").read_bytes() == (tmp_path / "direct.png").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["direct.png", "plot.png"]  # no temporary file left
    plt.close(fig)


def test_a_full_disk_becomes_one_line_naming_device_path_and_need(tmp_path) -> None:
    import errno

    from regulargpt.write_errors import DiskFullError, explain_write_error

    target = tmp_path / "run" / "model.pt"
    with pytest.raises(DiskFullError, match=r"^no space left on \S+ \(mounted at /.*\) while writing the checkpoint "
                                            r".*model\.pt: 12\.3 MB needed, [0-9.]+ MB free"):
        with explain_write_error(target, "the checkpoint", needed_bytes=12_300_000):
            raise OSError(errno.ENOSPC, "No space left on device")
    from regulargpt.write_errors import WriteError

    with pytest.raises(WriteError, match="could not write the checkpoint .*model.pt .*file write failed.*the folder "
                                         "is writable, has free space"):  # torch.save's zip writer loses the errno
        with explain_write_error(target, "the checkpoint"):
            raise RuntimeError("[enforce fail at inline_container.cc:778] . PytorchStreamWriter failed writing file "
                               "data/0: file write failed")
    with pytest.raises(ValueError):  # other errors pass unchanged
        with explain_write_error(target, "the checkpoint"):
            raise ValueError("not a write")
