"""Block checksums of split files: offsets computed by hand, digests by hashlib over slices read independently."""

import hashlib

from regulargpt.data.integrity import block_checksums, block_offsets


def test_offsets_of_a_large_file_are_evenly_spaced_and_end_at_the_end() -> None:
    offsets = block_offsets(10 * 2**20)  # (10,485,760 - 65,536) / 63 = 165,400.38…
    assert len(offsets) == 64
    assert offsets[:3] == [0, 165_400, 330_801]
    assert offsets[-1] == 10 * 2**20 - 2**16


def test_a_small_file_is_tiled_whole() -> None:
    assert block_offsets(0) == []
    assert block_offsets(100, blocks=4, block_bytes=30) == [0, 30, 60, 90]


def test_checksums_are_sha256_of_the_blocks_and_see_a_damaged_block(tmp_path) -> None:
    data = bytes(range(256)) * 4000  # 1,024,000 bytes > 8 blocks of 4 KiB: sampled, not tiled
    path = tmp_path / "split.bin"
    path.write_bytes(data)
    record = block_checksums(path, blocks=8, block_bytes=4096)
    step = (len(data) - 4096) / 7
    assert record["offsets"] == [round(i * step) for i in range(8)]
    assert record["sha256"] == [hashlib.sha256(data[o:o + 4096]).hexdigest() for o in record["offsets"]]
    damaged = bytearray(data)
    damaged[record["offsets"][3] + 10] ^= 0xFF
    path.write_bytes(bytes(damaged))
    assert block_checksums(path, blocks=8, block_bytes=4096)["sha256"][3] != record["sha256"][3]
