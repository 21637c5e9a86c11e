"""Work too large for the machine's memory is an error before it starts: the table's read (estimated from its
parquet metadata) and a router's fit (estimated from its queries and models), each naming the estimate, what is
available and what to do."""
from pathlib import Path

import pytest

import proxray.common.memory as memory
from proxray.cli import main
from proxray.routing.knn import KNNRouter
from proxray.routing.params import check_fit
from proxray.data.table import RoutingTable, read_memory


def test_available_memory_is_what_the_kernel_reports():
    total = next(int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                 if line.startswith("MemTotal:"))
    assert 0 < memory.available_bytes() <= total


def test_a_table_too_large_to_read_fails_before_it_is_read(shared_data, monkeypatch):
    path = shared_data / "routerdc7.parquet"
    need = read_memory(path, "parquet")
    assert 144_200 * 2560 < need < 1 << 30  # 144,200 long rows: above the 303 MB its read peaked at here
    monkeypatch.setattr(memory, "available_bytes", lambda: need)  # 80 % of it is not enough
    monkeypatch.setattr("pandas.read_parquet", lambda *a, **k: pytest.fail("read"))
    with pytest.raises(memory.TooLargeError, match=r"reading the routing table .*routerdc7.parquet needs about "
                                                   r"0\.\d GiB of memory; this machine has 0\.\d GiB available"):
        RoutingTable.read(path)


def test_a_fit_too_large_fails_before_encoding(shared_data, tmp_path, monkeypatch, capsys):
    t = RoutingTable.read(shared_data / "routerbench_slice.parquet")
    part = t.subset(t.query_ids[::10])
    part.write(tmp_path / "t.parquet")
    need_read = read_memory(tmp_path / "t.parquet", "parquet")
    monkeypatch.setattr(memory, "available_bytes", lambda: 2 * need_read)  # the read fits, a million queries do not
    with pytest.raises(memory.TooLargeError, match="fitting a knn router on 1000000 queries × 11 models"):
        check_fit(KNNRouter, {}, 1_000_000, 11)
    check_fit(KNNRouter, {}, part.n_queries, 11)  # the table's own fit fits
    monkeypatch.setattr(memory, "available_bytes", lambda: need_read + 1000)  # read: fits only without headroom
    monkeypatch.setattr("proxray.embeddings.encoder.SentenceEncoder.encode", lambda *a, **k: pytest.fail("encoded"))
    assert main(["fit", "--table", str(tmp_path / "t.parquet"), "--out", str(tmp_path / "r")]) == 2
    assert "needs about" in capsys.readouterr().err and not (tmp_path / "r").exists()
