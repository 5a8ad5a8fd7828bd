"""Time to the first training batch and memory of the data loader on a prepared folder (memory-mapped splits).

    python eval/bench_loader.py DIR
"""

import sys, time
t0 = time.perf_counter()
import torch  # noqa: F401  (training imports it anyway)
from regulargpt.data import WindowSampler, check_tokenizer, open_split
t1 = time.perf_counter()
split = open_split(sys.argv[1], "train")
check_tokenizer(sys.argv[1])
sampler = WindowSampler(split, seq_len=512, micro_batch_size=8, seed=0)
first = sampler.batch(0)
t2 = time.perf_counter()
for step in range(1, 500):
    sampler.batch(step)
t3 = time.perf_counter()
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
mb = lambda key: int(status[key].split()[0]) / 1024
print(f"{sys.argv[1]}: {len(split):,} train tokens; open + first batch {t2 - t1:.2f} s (imports {t1 - t0:.2f} s); "
      f"499 more batches of 8x513 {t3 - t2:.2f} s; RssAnon {mb('RssAnon'):.0f} MB, RssFile {mb('RssFile'):.0f} MB "
      f"(page cache of the mapped split, reclaimable)")
