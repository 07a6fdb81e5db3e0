"""pygd2fs.block_hashes is the same definition as Go's kvlayout.BlockHashes:
fixed vectors (pinned in kvlayout/blockhash_test.go too) and random ids
checked against `gd2fs session hashes` (the Go implementation)."""

import json
import random
import subprocess

import pytest

import pygd2fs


def test_golden():
    assert pygd2fs.block_hashes([1, 2, 3, 4, 5], 4) == [
        "3a60ee17b8d4f5b7d56818719a9b6674", "328906f368fed69168af268de548ec6e"]
    assert pygd2fs.block_hashes([0, 4294967295, 7], 16) == ["a6a0635f0b352475ee2fc14d16f60628"]
    assert pygd2fs.block_hashes([], 4) == []


def test_same_as_go(binary):
    r = random.Random(20)
    for n, pt in ((1, 1), (15, 16), (16, 16), (1000, 16), (777, 7), (300, 256)):
        ids = [r.randrange(0, 1 << 32) for _ in range(n)]
        out = subprocess.run([binary, "session", "hashes", "--page-tokens", str(pt), "--tokens", "-"],
                             input=json.dumps(ids).encode(), capture_output=True, check=True).stdout.decode()
        assert out.split() == pygd2fs.block_hashes(ids, pt), (n, pt)


def test_bad_ids():
    with pytest.raises(ValueError, match="0 to 4294967295"):
        pygd2fs.block_hashes([1, -1], 4)
    with pytest.raises(ValueError, match="0 to 4294967295"):
        pygd2fs.block_hashes([1 << 32], 4)
    with pytest.raises(TypeError):
        pygd2fs.block_hashes(["a"], 4)
    with pytest.raises(ValueError, match="page_tokens"):
        pygd2fs.block_hashes([1], 0)
