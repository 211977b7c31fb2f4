"""``nestplan sweep``: strict sweep files, the CSV, resume, failures, plot, Parquet and Ray."""

from __future__ import annotations

import csv
import json
import importlib.util
import re
import xml.etree.ElementTree as ET

import pytest

from nestplan.cli import main
from nestplan.errors import SpecError
from nestplan.sweep.run import LATER_COLUMNS
from nestplan.sweep.spec import RESULT_COLUMNS, TIME_PARTS, load

from console import cli, one_line_error
from procs import processes

# 12 quick points: 3 GPU counts x 2 methods x 2 NIC bandwidths
SMALL = """
[grid]
model = ["gpt-1p7b"]
cluster = ["dgx-h100-ndr"]
gpus = [8, 16, 32]
method = ["nest", "phaze"]
seq_len = [2048]
global_batch = [256]

[grid.network.leaf]
bandwidth_GBps = [25, 50]
"""
SMALL_POINTS = 12
COLUMNS = (["id", "model", "cluster", "gpus", "method", "seq_len", "global_batch", "precision",
            "network.leaf.bandwidth_GBps"] + list(RESULT_COLUMNS))


def _write(folder, text, name="s.toml"):
    path = folder / name
    path.write_text(text)
    return path


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _without_timing(rows):
    return {r["id"]: {k: v for k, v in r.items() if k != "search_seconds"} for r in rows}


@pytest.fixture(scope="module")
def pool_run(tmp_path_factory):
    """The small sweep run once with a two-process pool, with Parquet."""
    folder = tmp_path_factory.mktemp("pool")
    path = _write(folder, SMALL)
    args = ["sweep", str(path), "--workers", "2", "--quiet"]
    if importlib.util.find_spec("pyarrow") is not None:
        args.append("--parquet")
    assert main(args) == 0
    return path


# ----------------------------------------------------------------------------- strict loading

BASE = '[grid]\nmodel = ["gpt-1p7b"]\ncluster = ["dgx-h100-ndr"]\ngpus = [8]\n'


@pytest.mark.parametrize("text, needle", [
    (BASE + "gpu = [8]\n", "grid.gpu"),                                      # unknown grid key
    (BASE + "[sweeps]\noutput = 'x.csv'\n", "sweeps"),                      # unknown section
    (BASE + "[sweep]\nouput = 'x.csv'\n", "sweep.ouput"),                    # unknown [sweep] key
    ("[grid]\n", "grid"),                                                    # empty grid
    ("[sweep]\nparquet = true\n", "grid"),                                   # no grid at all
    (BASE.replace("[8]", "[]"), "grid.gpus"),                                # empty list
    (BASE.replace("gpt-1p7b", "llama9-1b"), "grid.model"),                   # unknown model
    (BASE.replace("dgx-h100-ndr", "dgx-h900"), "grid.cluster"),              # unknown cluster
    (BASE + "[grid.network.spin]\noversubscription = [2]\n", "spin"),        # unknown level
    (BASE + "[grid.network.spine]\noversub = [2]\n", "grid.network.spine.oversub"),
    (BASE + "[grid.network.spine]\noversubscription = [0.5]\n", "oversubscription"),
    (BASE + "[grid.network.spine]\nbandwidth_GBps = [-5]\n", "bandwidth_GBps"),
    (BASE + "[grid.network.spine]\noversubscription = []\n", "oversubscription"),
    (BASE.replace("[8]", "[8, 0]"), "grid.gpus"),                            # bad number
    (BASE.replace("[8]", "[8, 8]"), "grid.gpus"),                            # repeated value
    (BASE + 'method = ["nest", "best"]\n', "grid.method"),
    (BASE + 'precision = ["fp16"]\n', "grid.precision"),
    (BASE + "seq_len = [4096.5]\n", "grid.seq_len"),
    (BASE + "[constraints]\nzero = 4\n", "constraints.zero"),
    (BASE + "[constraints]\ntensor_parallel = 8\n", "constraints.tensor_parallel"),
    (BASE + "[constraints]\nrank_order = 'tp-dp'\n", "constraints.rank_order"),
    (BASE + 'stack = ["megatron-core", "titan"]\n', "grid.stack: got 'titan'; unknown stack"),
    (BASE + "stack = [3]\n", "grid.stack: got 3; must be a catalog name or a path"),
])
def test_bad_sweep_files_exit_2_with_one_line(tmp_path, capsys, text, needle):
    path = _write(tmp_path, text)
    assert main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("nestplan: error: ") and err.count("\n") == 1, err
    assert needle in err
    assert not (tmp_path / "s.csv").exists()  # stopped before any work


def test_unknown_key_lists_the_valid_ones(tmp_path, capsys):
    assert main(["sweep", str(_write(tmp_path, BASE + "[grid.network.leaf]\nlatency = [2]\n"))]) == 2
    err = capsys.readouterr().err
    assert "latency_us" in err and "oversubscription" in err and "bandwidth_GiBps" in err


def test_a_level_some_clusters_lack_is_varied_on_those_that_have_it(tmp_path, capsys):
    """dgx-h100-ndr has a "core" level, nest-h100-spineleaf has not: the core's values vary the
    first cluster's points, and the second runs once, its core cell blank (in the CSV, Parquet
    and the plot); a level no cluster has is still refused, and so is a named network's level
    one cluster lacks."""
    from nestplan.sweep.plot import summary_svg

    text = BASE.replace('["dgx-h100-ndr"]', '["dgx-h100-ndr", "nest-h100-spineleaf"]')
    path = _write(tmp_path, text + "[grid.network.core]\noversubscription = [2, 4]\n")
    spec = load(path)
    points = spec.points()
    assert [(p["cluster"], p["network.core.oversubscription"]) for p in points] == [
        ("dgx-h100-ndr", 2), ("dgx-h100-ndr", 4), ("nest-h100-spineleaf", None)]
    assert main(["sweep", str(path), "--quiet", "--workers", "1"]) == 0
    rows = _rows(tmp_path / "s.csv")
    assert [r["network.core.oversubscription"] for r in rows] == ["2", "4", ""]
    assert all(r["status"] == "ok" for r in rows)
    assert main(["sweep", str(path), "--quiet", "--workers", "1"]) == 0  # resumes: nothing new
    assert len(_rows(tmp_path / "s.csv")) == 3
    # plotted against the core's values (one GPU count), the cluster without one is left out
    svg = str(summary_svg(spec, [(p, 1.0) for p in points], omitted=0))
    assert "1 point on clusters without core not drawn" in svg
    assert "its levels as the labels set them" not in svg  # (two clusters: none fixed)
    one = load(_write(tmp_path, BASE + "[grid.network.core]\noversubscription = [2, 4]\n",
                      "one.toml"))
    # a fixed cluster whose levels vary is said to be so (a datacenter trial's header had named
    # the base file above lines at 4:1)
    assert "bf16; its levels as the labels set them" in str(summary_svg(
        one, [(p, 1.0) for p in one.points()], omitted=0))
    for extra, needle in (("[grid.network.moon]\noversubscription = [2]\n", "'moon'"),
                          ("[grid.networks.fast]\ncore = { oversubscription = 2 }\n",
                           "not a level of cluster nest-h100-spineleaf")):
        capsys.readouterr()
        assert main(["sweep", str(_write(tmp_path, text + extra, "bad.toml"))]) == 2
        err = capsys.readouterr().err
        assert needle in err and len(err.strip().splitlines()) == 1, err


def test_missing_extras_exit_2_with_the_pip_hint(tmp_path, capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("pyarrow", "ray") else real(name, *a))
    path = _write(tmp_path, BASE)
    assert main(["sweep", str(path), "--parquet"]) == 2
    assert "pip install 'nestplan[parquet]'" in capsys.readouterr().err
    assert main(["sweep", str(path), "--ray", "local"]) == 2
    assert "pip install 'nestplan[ray]'" in capsys.readouterr().err
    assert not (tmp_path / "s.csv").exists()


@pytest.mark.parametrize("address", ["127.0.0.1:1", "ray://127.0.0.1:1"])
def test_a_ray_address_where_nothing_answers_is_refused_at_once(tmp_path, address):
    """A head's address where nothing listens: one line, before Ray is started (Ray's core had
    retried it for minutes, printing its own log lines; Ray's client had said "cannot pickle
    'module' object", of the runtime env that ships nestplan)."""
    pytest.importorskip("ray")
    # (a grid with a note to make: the refusal comes before any note, one line)
    grid = _write(tmp_path, BASE + "moe_imbalance = [1.0, 1.2]\n")
    code, out, err = cli("sweep", grid, "--ray", address, timeout=60)
    assert one_line_error(code, out, err, f"--ray: got '{address}'; nothing answers at "
                                          "127.0.0.1:1 (Connection refused)"), err
    assert not (tmp_path / "s.csv").exists()


def test_a_ray_address_is_probed_once_per_sweep(tmp_path, monkeypatch, capsys):
    """The command probes the head before its notes; ``run_sweep`` probes it for callers of the
    API, not again for the command (it had been probed twice; a per-process cache of answered
    addresses, a reviewer found, would have kept a long-lived caller from noticing a head gone
    since)."""
    import socket

    from nestplan.sweep import run as sweep_run

    calls = []
    real = sweep_run.check_reachable
    monkeypatch.setattr(sweep_run, "check_reachable", lambda a: calls.append(a) or real(a))
    # Ray itself is not started: its backend runs the points here
    monkeypatch.setattr(sweep_run, "_ray", lambda tasks, address, workers:
                        sweep_run._in_process(tasks))
    monkeypatch.setattr(sweep_run, "check_extras", lambda **kw: None)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        address = "127.0.0.1:%d" % server.getsockname()[1]
        assert main(["sweep", str(_write(tmp_path, BASE)), "--ray", address, "--quiet"]) == 0
        assert calls == [address]
        sweep_run.run_sweep(load(_write(tmp_path, BASE, "again.toml")), ray=address, quiet=True)
        assert calls == [address, address]
    capsys.readouterr()


# ----------------------------------------------------------------------------- the spec


def test_ids_are_stable_and_distinct(tmp_path):
    a = load(_write(tmp_path, SMALL, "a.toml"))
    # same points written differently: reordered keys, floats for integers, defaults spelled out
    text = SMALL.replace("bandwidth_GBps = [25, 50]", "bandwidth_GBps = [25.0, 50.0]").replace(
        'method = ["nest", "phaze"]', 'method = ["phaze", "nest"]\nprecision = ["bf16"]')
    b = load(_write(tmp_path, text, "b.toml"))
    ids = [p.id for p in a.points()]
    assert len(set(ids)) == SMALL_POINTS
    assert set(ids) == {p.id for p in b.points()}
    c = load(_write(tmp_path, SMALL + "[constraints]\ntp = 2\n", "c.toml"))
    assert not set(ids) & {p.id for p in c.points()}  # constraints are part of the id


def test_stack_is_a_grid_key(tmp_path):
    """A sweep may vary the training stack (a name or a path); grids that do not name it keep
    their point ids, and each point is searched for its stack."""
    (tmp_path / "mine.toml").write_text('base = "torchtitan"\nname = "mine"\n')
    spec = load(_write(tmp_path, BASE + 'stack = ["megatron-core", "mine.toml"]\n'))
    points = spec.points()
    assert [spec.scenario(p).stack.name for p in points] == ["megatron-core", "mine"]
    plain = load(_write(tmp_path, BASE, "plain.toml")).points()
    assert plain[0].id not in {p.id for p in points}
    assert dict(plain[0].values).keys() == {"model", "cluster", "gpus", "method", "seq_len",
                                            "global_batch", "precision"}
    assert main(["sweep", str(tmp_path / "s.toml"), "--quiet", "--workers", "1"]) == 0
    rows = _rows(tmp_path / "s.csv")
    assert [r["stack"] for r in rows] == ["megatron-core", "mine.toml"]
    assert rows[1]["zero"] in ("0", "2", "3")  # a plan the torchtitan-based stack runs


def test_network_overrides_replace_the_level_value(tmp_path):
    # nest-h100-spineleaf gives its bandwidths in GiB/s: a GB/s override replaces that key
    text = BASE.replace("dgx-h100-ndr", "nest-h100-spineleaf") + (
        "[grid.network.spine]\nbandwidth_GBps = [10]\noversubscription = [3]\n")
    spec = load(_write(tmp_path, text))
    (point,) = spec.points()
    spine = {lv.name: lv for lv in spec.scenario(point).cluster.levels}["spine"]
    assert spine.bandwidth == pytest.approx(10e9)
    assert spine.oversubscription == 3.0
    leaf = {lv.name: lv for lv in spec.scenario(point).cluster.levels}["leaf"]
    assert leaf.bandwidth == pytest.approx(12.5 * 2**30)  # untouched


def test_a_named_network_sets_several_levels_at_once(tmp_path):
    """[grid.networks.NAME] ties levels together (a NIC upgrade moves leaf and spine): the
    network column takes each name in turn, with the varied levels crossed; editing a named
    network's values gives its points new ids (they run again), and the others keep theirs."""
    nets = ("[grid.networks.nic400]\nleaf = { bandwidth_GBps = 50 }\nspine = { bandwidth_GBps = 50 }"
            "\n[grid.networks.nic800]\nleaf = { bandwidth_GBps = 100 }\n"
            "spine = { bandwidth_GBps = 100, oversubscription = 2 }\n"
            "[grid.network.core]\nlatency_us = [5, 10]\n")
    spec = load(_write(tmp_path, BASE + nets))
    assert spec.columns[:10] == ("id", "model", "cluster", "gpus", "method", "seq_len",
                                 "global_batch", "precision", "network", "network.core.latency_us")
    seen = []
    for point in spec.points():
        levels = {lv.name: lv for lv in spec.scenario(point).cluster.levels}
        seen.append((point["network"], levels["leaf"].bandwidth, levels["spine"].bandwidth,
                     levels["spine"].oversubscription, levels["core"].latency))
    assert [s[0] for s in seen] == ["nic400", "nic400", "nic800", "nic800"]
    for got, want in zip(seen, [(50e9, 50e9, 1.0, 5e-6), (50e9, 50e9, 1.0, 10e-6),
                                (100e9, 100e9, 2.0, 5e-6), (100e9, 100e9, 2.0, 10e-6)]):
        assert got[1:] == pytest.approx(want)
    edited = load(_write(tmp_path, BASE + nets.replace("oversubscription = 2", "oversubscription = 4"),
                         "e.toml"))
    before = {p.id: p["network"] for p in spec.points()}
    after = {p.id: p["network"] for p in edited.points()}
    assert {i for i, n in before.items() if n == "nic400"} == {i for i, n in after.items()
                                                               if n == "nic400"}
    assert not {i for i, n in before.items() if n == "nic800"} & set(after)
    same = load(_write(tmp_path, BASE + nets.replace("= 100 }", "= 100.0 }"), "f.toml"))
    assert [p.id for p in same.points()] == list(before)  # 100 and 100.0 are one value
    assert main(["sweep", str(tmp_path / "s.toml"), "--quiet", "--workers", "1"]) == 0
    rows = _rows(tmp_path / "s.csv")
    assert [r["network"] for r in rows] == ["nic400", "nic400", "nic800", "nic800"]
    assert all(r["status"] == "ok" for r in rows)


# ----------------------------------------------------------------------------- running


def test_pool_run_writes_one_row_per_point(pool_run):
    rows = _rows(pool_run.with_suffix(".csv"))
    with open(pool_run.with_suffix(".csv"), newline="") as f:
        assert next(csv.reader(f)) == COLUMNS
    assert len(rows) == SMALL_POINTS
    # in the grid's order, however the two workers finished them (a NEST-paper trial's rows came
    # in finishing order)
    assert [r["id"] for r in rows] == [p.id for p in load(pool_run).points()]
    for r in rows:
        assert r["status"] == "ok" and r["error"] == "" and r["fits"] == "true"
        degrees = int(r["tp"]) * int(r["pp"]) * int(r["dp"]) * int(r["cp"])
        assert degrees == int(r["gpus"])
        assert float(r["tokens_per_s_per_gpu"]) * int(r["gpus"]) == pytest.approx(
            float(r["tokens_per_s"]))
        # the step's parts (what a network design changes shows in them) add up to it
        parts = [float(r[c]) for c in COLUMNS if c.startswith("time_")]
        assert len(parts) == len(TIME_PARTS) and sum(parts) == pytest.approx(
            float(r["step_time_s"]))
        assert 0 < float(r["hfu"]) and float(r["margin_gib"]) >= 0
    assert {(r["gpus"], r["method"], r["network.leaf.bandwidth_GBps"]) for r in rows} == {
        (g, m, b) for g in ("8", "16", "32") for m in ("nest", "phaze") for b in ("25", "50")}


def test_pool_run_writes_a_valid_svg(pool_run):
    root = ET.parse(pool_run.with_suffix(".svg")).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    lines = root.findall(".//{http://www.w3.org/2000/svg}polyline")
    assert len(lines) == 4  # one series per method x bandwidth, three GPU counts each
    assert all(len(pl.get("points").split()) == 3 for pl in lines)


@pytest.mark.parquet
def test_pool_run_writes_parquet(pool_run):
    pq = pytest.importorskip("pyarrow.parquet")
    table = pq.read_table(pool_run.with_suffix(".parquet"))
    assert table.num_rows == SMALL_POINTS
    assert table.column_names == COLUMNS
    assert str(table.schema.field("gpus").type) == "int64"
    assert str(table.schema.field("id").type) == "string"
    assert str(table.schema.field("fits").type) == "bool"
    assert sorted(table.column("id").to_pylist()) == sorted(
        r["id"] for r in _rows(pool_run.with_suffix(".csv")))


def test_failed_points_are_recorded_and_the_others_run(tmp_path, capsys):
    text = """
[grid]
model = ["gpt-1p7b", "llama3-70b"]
cluster = ["dgx-h100-ndr"]
gpus = [8, 12]
seq_len = [2048]
global_batch = [256]
[constraints]
tp = 8
"""
    path = _write(tmp_path, text)
    assert main(["sweep", str(path), "--workers", "1", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "1 ok, 1 infeasible, 2 errors" in out
    status = {(r["model"], r["gpus"]): r for r in _rows(tmp_path / "s.csv")}
    assert status["gpt-1p7b", "8"]["status"] == "ok"
    assert status["llama3-70b", "8"]["status"] == "infeasible"  # 70B does not fit on 8 GPUs
    for model in ("gpt-1p7b", "llama3-70b"):  # tp = 8 cannot divide 12 GPUs
        row = status[model, "12"]
        assert row["status"] == "error" and "tp" in row["error"] and "12" in row["error"]
        assert row["step_time_s"] == ""


def test_a_sweep_whose_every_point_failed_exits_1(tmp_path, capsys, monkeypatch):
    """Every point an error row (nothing searched): exit 1 and one line saying so; the rows stay
    to say why, and the same command retries them. Some points failing keeps exit 0 (above)."""
    from nestplan.search import methods

    def broken(*args, **kw):
        raise RuntimeError("search broke")

    monkeypatch.setattr(methods, "run_method", broken)
    path = _write(tmp_path, SMALL)
    assert main(["sweep", str(path), "--workers", "1", "--quiet"]) == 1
    out, err = capsys.readouterr()
    assert f"0 ok, 0 infeasible, {SMALL_POINTS} errors" in out
    assert err.strip().splitlines()[-1].startswith("nestplan: sweep: every point failed")
    rows = _rows(tmp_path / "s.csv")
    assert len(rows) == SMALL_POINTS
    assert {r["error"] for r in rows} == {"RuntimeError: search broke"}
    monkeypatch.undo()
    assert main(["sweep", str(path), "--workers", "1", "--quiet"]) == 0


def test_a_sweep_where_nothing_fits_anywhere_says_so(tmp_path, capsys):
    """Every point infeasible: still exit 0 (each has its row), and a note says no point found a
    plan, naming the first's reason (it had been only counted); a sweep with a plan says
    nothing of it."""
    path = _write(tmp_path, '[grid]\nmodel = ["llama3-405b"]\ncluster = ["dgx-h100-ndr"]\n'
                            'gpus = [8, 16]\n')
    assert main(["sweep", str(path), "--workers", "1", "--quiet"]) == 0
    got = capsys.readouterr()
    assert "0 ok, 2 infeasible" in got.out
    # on stderr as every command's notes (a datacenter trial's 2>/dev/null had kept them)
    assert "nestplan: note: no point found a plan that fits; each infeasible row's error " \
        "column says why (the first, " in got.err and "nothing fits in" in got.err
    assert "note" not in got.out
    path = _write(tmp_path, SMALL, "small.toml")
    assert main(["sweep", str(path), "--workers", "1", "--quiet"]) == 0
    assert "no point found a plan" not in capsys.readouterr().err


class _Counting:
    """Wraps run_method: counts calls, raises KeyboardInterrupt at call ``stop_at``."""

    def __init__(self, real, stop_at=None):
        self.real, self.stop_at, self.calls = real, stop_at, 0

    def __call__(self, *args, **kw):
        self.calls += 1
        if self.calls == self.stop_at:
            raise KeyboardInterrupt
        return self.real(*args, **kw)


def test_rows_hold_the_schedule_and_etp_where_they_mean_something(pool_run):
    for r in _rows(pool_run.with_suffix(".csv")):
        assert r["etp"] == ""  # a dense model
        assert (r["schedule"] == "") == (r["pp"] == "1")


def test_an_moe_rows_etp_is_its_plans(tmp_path):
    """An MoE model's rows give the expert-tensor degree of the plan found (a dense model's are
    blank, above): the same plan as ``plan`` finds for the point."""
    import json

    model = _write(tmp_path, """name = "small-moe"
layers = 4
hidden = 1024
heads = 8
ffn_hidden = 4096
vocab = 32000
mlp = "swiglu"

[moe]
experts = 8
top_k = 2
ffn_hidden = 2048
""", "small-moe.toml")
    path = _write(tmp_path, f"""
[grid]
model = ["{model}"]
cluster = ["dgx-h100-ndr"]
gpus = [16]
method = ["nest"]
seq_len = [4096]
global_batch = [64]
""")
    assert main(["sweep", str(path), "--workers", "1", "--quiet"]) == 0
    (row,) = _rows(path.with_suffix(".csv"))
    assert row["status"] == "ok" and row["etp"].isdigit()
    code, out, err = cli("plan", "--model", model, "--cluster", "dgx-h100-ndr",
                         "--gpus", 16, "--seq-len", 4096, "--global-batch", 64, "--json")
    assert code == 0, err
    best = json.loads(out)
    assert (int(row["ep"]), int(row["etp"]), int(row["tp"])) == (best["ep"], best["etp"], best["tp"])


@pytest.mark.parametrize("before", [sum(LATER_COLUMNS[i:], ()) for i in range(len(LATER_COLUMNS))],
                         ids=lambda cols: cols[0])
def test_a_results_file_of_before_the_later_columns_resumes(tmp_path, pool_run, capsys, before):
    """A results CSV written before the etp and schedule columns existed, before stage_layers, or
    before the HFU, margin and time-part columns, resumes: its rows are kept with those cells
    blank and only the missing points run. (A point's id holds the nestplan build that ran it,
    so only a row of this build can be one of its points, as these are; another build's rows
    are moved aside, ``test_rows_another_nestplan_wrote_are_moved_aside``.)"""
    path = _write(tmp_path, SMALL)
    # kept rows with pipelining among them: a schedule run again would not be blank
    rows = sorted(_rows(pool_run.with_suffix(".csv")), key=lambda r: r["pp"] == "1")[:5]
    old = [c for c in COLUMNS if c not in before]
    with open(tmp_path / "s.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=old, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    assert main(["sweep", str(path), "--dry-run"]) == 0
    assert "5 already done, 7 to run" in capsys.readouterr().out
    assert main(["sweep", str(path), "--workers", "1", "--quiet"]) == 0
    with open(tmp_path / "s.csv", newline="") as f:
        assert next(csv.reader(f)) == COLUMNS
    again = {r["id"]: r for r in _rows(tmp_path / "s.csv")}
    assert len(again) == SMALL_POINTS and not (tmp_path / "s.csv.superseded").exists()
    assert all(all(again[r["id"]][c] == "" for c in before) and again[r["id"]]["step_time_s"] ==
               r["step_time_s"] for r in rows)
    assert any(r["schedule"] for r in rows)  # (blank above because the file had none)


def test_rows_searched_under_other_constraints_say_which(tmp_path):
    """A grid run with [constraints] and again without, into one file: every row names the
    constraints it was searched under (a datacenter trial's rows of both had read alike but for
    their results), errors included."""
    grid = ('[grid]\nmodel = ["gpt-1p7b"]\ncluster = ["dgx-h100-ndr"]\ngpus = [8, 12]\n'
            'seq_len = [2048]\nglobal_batch = [96]\n')
    path = _write(tmp_path, grid + '[constraints]\ntp = 8\nsp = true\n')
    assert main(["sweep", str(path), "--workers", "1", "--quiet"]) == 0
    assert sorted((r["gpus"], r["status"], r["constraints"]) for r in _rows(
        tmp_path / "s.csv")) == [("12", "error", "sp=true;tp=8"), ("8", "ok", "sp=true;tp=8")]
    _write(tmp_path, grid)  # (the error row goes: a re-run retries errors)
    assert main(["sweep", str(path), "--workers", "1", "--quiet"]) == 0
    rows = _rows(tmp_path / "s.csv")
    assert sorted((r["gpus"], r["status"], r["constraints"]) for r in rows) == [
        ("12", "ok", ""), ("8", "ok", ""), ("8", "ok", "sp=true;tp=8")]
    assert all(r["tp"] == "8" for r in rows if r["constraints"])


def test_interrupt_then_resume_runs_only_the_missing_points(tmp_path, capsys, monkeypatch):
    from nestplan.search import methods

    path = _write(tmp_path, SMALL)
    csv_path = tmp_path / "s.csv"
    args = ["sweep", str(path), "--workers", "1", "--quiet"]
    counter = _Counting(methods.run_method, stop_at=5)
    monkeypatch.setattr(methods, "run_method", counter)
    assert main(args) == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "4 of 12 points done" in err and "resume" in err
    assert len(_rows(csv_path)) == 4
    assert not (tmp_path / "s.svg").exists()

    counter = _Counting(counter.real)
    monkeypatch.setattr(methods, "run_method", counter)
    assert main(["sweep", str(path), "--dry-run"]) == 0
    assert "4 already done, 8 to run" in capsys.readouterr().out
    assert main(args) == 0
    assert counter.calls == SMALL_POINTS - 4
    assert "8 run (8 ok, 0 infeasible, 0 errors), 4 already done" in capsys.readouterr().out
    rows = _rows(csv_path)
    assert len(rows) == SMALL_POINTS == len({r["id"] for r in rows})

    # an error row is run again and replaced; a torn last line (a killed run) is moved aside
    rows[3].update(status="error", error="boom", step_time_s="")
    rows[6]["tp"] = str(3 * int(rows[6]["tp"]))  # degrees edited past the GPU count: run again
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
        f.write(rows[5]["id"] + ",gpt-1p7b,dgx-h1")
    counter.calls = 0
    assert main(args) == 0
    assert counter.calls == 2
    again = _rows(csv_path)
    assert len(again) == SMALL_POINTS == len({r["id"] for r in again})
    assert {r["status"] for r in again} == {"ok"}
    assert _without_timing(again)[rows[3]["id"]]["step_time_s"] != ""
    # into PATH.dropped, with a note (a line that was no row had vanished without a word); the
    # retried error row is replaced, not set aside
    assert "2 lines of" in capsys.readouterr().err
    aside = (tmp_path / "s.csv.dropped").read_text().splitlines()
    assert aside[0].startswith(rows[6]["id"] + ",") and aside[1] == rows[5]["id"] + ",gpt-1p7b,dgx-h1"


def test_a_csv_with_other_columns_is_refused(tmp_path, capsys):
    path = _write(tmp_path, SMALL)
    (tmp_path / "s.csv").write_text("id,model,status\nabc,gpt-1p7b,ok\n")
    assert main(["sweep", str(path), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "columns" in err and "--output" in err
    assert (tmp_path / "s.csv").read_text() == "id,model,status\nabc,gpt-1p7b,ok\n"


@pytest.mark.ray
@pytest.mark.xdist_group("ray")  # one Ray at a time: ray stop ends every instance here
def test_ray_gives_the_same_rows_as_the_pool(pool_run, tmp_path, capsys):
    pytest.importorskip("ray")
    out = tmp_path / "ray.csv"
    assert main(["sweep", str(pool_run), "--ray", "local", "--workers", "2", "-o", str(out),
                 "--quiet"]) == 0
    assert f"{SMALL_POINTS} run ({SMALL_POINTS} ok" in capsys.readouterr().out
    assert _without_timing(_rows(out)) == _without_timing(_rows(pool_run.with_suffix(".csv")))


def _session(temp: str, port: int) -> dict[int, bytes]:
    """The processes of the Ray instance started with ``--temp-dir temp --port port`` (those
    naming the directory or the head's address, and their descendants, its workers among them;
    the client server names only the address, and outlives its parent): pid -> command line."""
    procs = processes()
    address = b"--address="
    mine = {pid for pid, (_, cmd) in procs.items()
            if temp.encode() in cmd or any(a.startswith(address) and a.endswith(f":{port}".encode())
                                           for a in cmd.split(b"\0"))}
    grown = True
    while grown:
        more = {pid for pid, (ppid, _) in procs.items() if ppid in mine} - mine
        mine |= more
        grown = bool(more)
    return {pid: procs[pid][1] for pid in mine}


@pytest.mark.ray
@pytest.mark.xdist_group("ray")
def test_a_killed_ray_worker_loses_no_point(pool_run, tmp_path):
    """``sweep --ray ADDRESS`` against a Ray head started apart (``ray start --head``), as on a
    cluster (nestplan is shipped to the workers): one of its worker processes is killed while it
    runs a point; the sweep still finishes, the point runs again (without the retry it would be
    an error row), and the CSV has every point once. Only this head's processes are touched."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time
    from pathlib import Path

    from console import NESTPLAN

    pytest.importorskip("ray")
    if not os.path.isdir("/proc"):
        pytest.skip("finds Ray's worker processes through /proc")
    import shutil
    import tempfile

    ray_cli = str(Path(sys.executable).parent / "ray")
    with socket.socket() as s:  # a free port for the head
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    temp = tempfile.mkdtemp(prefix="nestplan-ray-", dir="/tmp")  # short: Ray's socket paths
    # Ray 2.5x turns token authentication on for `ray start --head`; a driver reads the token
    # that the head wrote (~/.ray/auth_token) when the mode is set in its environment too
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token"}
    start = subprocess.run([ray_cli, "start", "--head", f"--port={port}", "--num-cpus=2",
                            f"--temp-dir={temp}", "--include-dashboard=false",
                            "--disable-usage-stats"],
                           capture_output=True, text=True, env=env, timeout=180)
    try:
        assert start.returncode == 0, start.stderr[-2000:]
        out = tmp_path / "ray.csv"
        sweep = subprocess.Popen([NESTPLAN, "sweep", str(pool_run), "--ray", f"127.0.0.1:{port}",
                                  "-o", str(out), "--quiet"], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        killed = None
        deadline = time.monotonic() + 240
        while sweep.poll() is None and time.monotonic() < deadline:
            if killed is None:  # a worker of this head, busy with a point
                busy = [pid for pid, cmd in _session(temp, port).items()
                        if cmd.startswith(b"ray::run_task")]
                if busy:
                    killed = busy[0]
                    os.kill(killed, signal.SIGKILL)
            time.sleep(0.05)
        stdout, stderr = sweep.communicate(timeout=60)
        assert sweep.returncode == 0, stderr[-2000:]
        assert killed is not None, "no Ray worker was seen running a point"
        rows = _rows(out)
        assert len(rows) == SMALL_POINTS and len({r["id"] for r in rows}) == SMALL_POINTS
        assert {r["status"] for r in rows} == {"ok"}
        assert _without_timing(rows) == _without_timing(_rows(pool_run.with_suffix(".csv")))
    finally:  # this head's processes only (``ray stop`` would end every Ray here)
        for pid in _session(temp, port):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        shutil.rmtree(temp, ignore_errors=True)


def test_the_plot_draws_identical_series_once_and_ticks_the_gpu_counts(tmp_path):
    """Networks a plan does not feel give identical series: one line, its label naming the
    others where that is short (a NEST-paper trial's "(= 1 more)" hid which), else counting
    them; a linear GPU axis is ticked at the counts swept, inside the canvas; tooltips write
    values from 1,000 on whole with separators (they had mixed "1.326e+04" and "9,449")."""
    from nestplan.sweep.plot import WIDTH, summary_svg

    spec = load(_write(tmp_path, SMALL.replace("gpus = [8, 16, 32]", "gpus = [256, 512]")))
    results = [(p, 1000.0 + p["gpus"]) for p in spec.points() if p["method"] == "nest"]
    root = ET.fromstring(str(summary_svg(spec, results, omitted=0)))
    ns = "{http://www.w3.org/2000/svg}"
    assert len(root.findall(f".//{ns}polyline")) == 1  # both bandwidths alike: drawn once
    texts = [t.text for t in root.iter(f"{ns}text")]
    assert any(t and t.endswith("(= leaf 50 GB/s)") for t in texts), texts
    tips = [t.text for t in root.iter(f"{ns}title") if t.text and ": x=" in t.text]
    assert tips and all(t.endswith(("y=1,256", "y=1,512")) for t in tips), tips
    ticks = [t for t in root.iter(f"{ns}text") if t.text in ("256", "512")]
    assert len(ticks) == 2 and all(0 <= float(t.get("x")) <= WIDTH for t in ticks)


NETWORK_STUDY = """
[grid]
model = ["{model}"]
method = ["{method}"]
cluster = ["dgx-h100-ndr", "nest-h100-spineleaf"]
gpus = [256, 512]
global_batch = [1024]

[grid.network.spine]
oversubscription = [{oversubscription}]
{networks}"""
NICS = {400: 50, 200: 25, 100: 12.5}


def _study(tmp_path, name, nics=(), oversubscription="1, 2, 3, 4", model="llama3-8b",
           method="nest"):
    """A network study's sweep: two clusters, spine oversubscriptions and named NIC speeds."""
    networks = "".join(f"[grid.networks.nic{n}]\nleaf = {{ bandwidth_GBps = {NICS[n]:g} }}\n"
                       for n in nics)
    return load(_write(tmp_path, NETWORK_STUDY.format(
        model=model, method=method, oversubscription=oversubscription, networks=networks), name))


def test_the_plot_labels_series_by_what_tells_them_apart_and_keeps_the_slowest(tmp_path):
    """A network study's series (two clusters x spine oversubscriptions x named networks) had been
    labelled "dgx-h100-ndr, nic400, spi…", three lines alike, and the slowest designs left out:
    what every drawn series shares goes to the panel's title, the labels are whole, and past
    ``MAX_SERIES`` the slowest half is drawn beside the fastest."""
    from nestplan.sweep.plot import MAX_SERIES, summary_svg

    ns = "{http://www.w3.org/2000/svg}"

    def texts(spec, keep=lambda p: True):
        points = [p for p in spec.points() if keep(p)]  # each series its own line
        root = ET.fromstring(str(summary_svg(spec, [(p, 1000.0 - 10 * i)
                                                    for i, p in enumerate(points)], omitted=0)))
        return [t.text or "" for t in root.iter(f"{ns}text")]

    shown = texts(_study(tmp_path, "s.toml", (400, 200)))
    labels = [t for t in shown if "spine" in t and ":1" in t and "series" not in t]
    assert len(labels) == MAX_SERIES and not any("…" in t for t in labels), labels
    assert any("spine 4:1" in t and "nest-h100-spineleaf" in t and "nic200" in t
               for t in labels)  # the slowest series is drawn
    assert any(t.endswith(f"({MAX_SERIES} of 16 series: the 5 fastest and the 5 slowest)")
               for t in shown), shown
    # a long shared title is cut beside the note, which stays whole (a review's: it had been cut)
    shown = texts(_study(tmp_path, "long.toml", (400, 200, 100), model="qwen3-235b-a22b",
                         method="exhaustive"), lambda p: p["cluster"] == "nest-h100-spineleaf")
    titles = [t for t in shown if "series" in t]
    assert len(titles) == 1 and titles[0].endswith(
        f"({MAX_SERIES} of 12 series: the 5 fastest and the 5 slowest)"), titles
    assert titles[0].startswith("qwen3-235b-a22b · exhaustive")
    # one cluster and network: they go to the title, the labels keep the oversubscription
    shown = texts(_study(tmp_path, "one.toml", oversubscription="1, 2, 4"),
                  lambda p: p["cluster"] == "dgx-h100-ndr")
    assert {"spine 1:1", "spine 2:1", "spine 4:1"} <= set(shown), shown
    assert any("· dgx-h100-ndr" in t for t in shown), shown


def test_the_plot_names_a_file_given_by_path_by_its_name():
    """A stack (or model, cluster) swept by path is labelled by its file name: a label cut at its
    width would show only the folders."""
    from nestplan.sweep.plot import _label
    from nestplan.sweep.spec import Parameter

    stacks = Parameter(key="stack",
                       values=("/a/rather/long/folder/of/stacks/mine-with-eager.toml", "nemo"))
    assert _label([stacks], ("/a/rather/long/folder/of/stacks/mine-with-eager.toml",)) == \
        "mine-with-eager"
    assert _label([stacks], ("nemo",)) == "nemo"
    # a HuggingFace config by its folder; two files of one name as given
    models = Parameter(key="model", values=("/hf/gpt-oss-20b/config.json", "a/m.toml", "b/m.toml"))
    assert [_label([models], (v,), 100) for v in models.values] == [
        "gpt-oss-20b", "a/m.toml", "b/m.toml"]


ONE = """
[grid]
model = ["gpt-1p7b"]
cluster = ["dgx-h100-ndr"]
gpus = [8]
seq_len = [2048]
global_batch = [64]
"""


def test_every_file_a_sweep_writes_is_checked_before_it_runs(tmp_path):
    """A directory where the plot (or the Parquet copy) would go is refused up front, one line,
    not after the points ran."""
    from console import cli, one_line_error

    path = _write(tmp_path, ONE)
    (tmp_path / "s.svg").mkdir()
    assert one_line_error(*cli("sweep", path, "--workers", 1), "s.svg'; a directory; give a plot")
    assert not (tmp_path / "s.csv").exists()


def test_a_result_cell_edited_by_hand_is_run_again(tmp_path):
    """A resumed sweep drops an ``ok`` row whose numbers do not read back (a word, inf, an
    integer column with a fraction, a negative time, which a fuzzer's resume had kept) and runs
    its point again, instead of failing in the plot."""
    from console import cli

    path = _write(tmp_path, ONE)
    code, _, err = cli("sweep", path, "--workers", 1, "--quiet")
    assert code == 0, err
    rows = _rows(tmp_path / "s.csv")
    for column, bad in (("tokens_per_s_per_gpu", "fast"), ("mfu", "inf"), ("tp", "1.5"),
                        ("step_time_s", "-1")):
        edited = [{**rows[0], column: bad}]
        with open(tmp_path / "s.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(edited)
        code, _, err = cli("sweep", path, "--workers", 1, "--quiet")
        assert code == 0 and "Traceback" not in err, err
        assert _rows(tmp_path / "s.csv")[0][column] == rows[0][column], column


def test_a_results_file_it_cannot_resume_is_one_line_without_the_notes(tmp_path):
    """The grid's notes (a level no point crosses) are not printed before the refusal of a
    results file of something else: the error is the one line."""
    from console import cli, one_line_error

    grid = ('[grid]\nmodel = ["gpt-1p7b"]\ncluster = ["nest-h100-spineleaf"]\ngpus = [16, 32]\n'
            'seq_len = [2048]\nglobal_batch = [512]\n'
            '[grid.network.spine]\noversubscription = [1, 4]\n')
    path = _write(tmp_path, grid, "real.toml")
    code, _, err = cli("sweep", path, "--dry-run")
    assert code == 0 and "no point crosses this level" in err, err
    (tmp_path / "real.csv").write_text("hello world\n")
    code, out, err = cli("sweep", path, "--quiet")
    assert one_line_error(code, out, err, "its columns are not this sweep's"), err


def test_a_grid_sets_mtp_depths_headroom_and_a_fixed_schedule(tmp_path):
    """A model with multi-token prediction on a stack without it needs mtp_layers = [0], as plan
    needs --mtp-layers 0; memory_headroom_pct is plan's --memory-headroom; [constraints]
    schedule fixes the schedule as --schedule does."""
    grid = ('[grid]\nmodel = ["deepseek-v3"]\ncluster = ["dgx-h100-ndr"]\ngpus = [256]\n'
            'stack = ["deepspeed"]\n')
    plain = load(_write(tmp_path, grid, "plain.toml"))
    with pytest.raises(SpecError, match="mtp_layers = \\[0\\] in a sweep grid"):
        plain.scenario(plain.points()[0])
    spec = load(_write(tmp_path, grid + "mtp_layers = [0]\nmemory_headroom_pct = [10]\n"
                       "[constraints]\nschedule = \"1f1b\"\npp = 2\n"))
    sc = spec.scenario(spec.points()[0])
    assert sc.model.mtp_layers == 0 and sc.memory_headroom == pytest.approx(0.10)
    assert spec.constraints.schedule == "1f1b"
    assert "mtp_layers" in spec.columns and "memory_headroom_pct" in spec.columns
    # keys named only when given: an older sweep's point ids stay
    assert [p.id for p in plain.points()] == [p.id for p in load(_write(
        tmp_path, grid, "again.toml")).points()]


def test_an_edited_cluster_file_runs_its_points_again(tmp_path, capsys):
    """A point's id holds what the files it names load (a cluster here): after the file is
    edited the re-run runs that point again, not the one on the catalog cluster; the old row is
    kept as a row of another grid, and the note says the plot draws this sweep's points only (a
    datacenter trial's other grid's plot had been redrawn without a word)."""
    from pathlib import Path

    import nestplan

    catalog = Path(nestplan.__file__).parent / "catalog" / "clusters" / "dgx-h100-ndr.toml"
    fab = tmp_path / "fab.toml"
    fab.write_text(catalog.read_text().replace('name = "dgx-h100-ndr"', 'name = "fab"'))
    text = ('[grid]\nmodel = ["llama3-8b"]\ncluster = ["fab.toml", "dgx-h100-ndr"]\n'
            'gpus = [16]\nseq_len = [2048]\nglobal_batch = [64]\n')
    path = _write(tmp_path, text)
    before = {p["cluster"]: p.id for p in load(path).points()}
    assert main(["sweep", str(path), "--quiet", "--workers", "1"]) == 0
    fab.write_text(fab.read_text().replace("latency_us = 3.4", "latency_us = 30", 1))
    after = {p["cluster"]: p.id for p in load(path).points()}
    assert after["dgx-h100-ndr"] == before["dgx-h100-ndr"]
    assert after["fab.toml"] != before["fab.toml"]
    capsys.readouterr()
    assert main(["sweep", str(path), "--quiet", "--workers", "1"]) == 0
    rows = list(csv.DictReader(open(tmp_path / "s.csv")))
    assert sorted(r["id"] for r in rows) == sorted({*before.values(), after["fab.toml"]})
    err = capsys.readouterr().err
    assert "1 row of" in err and "its plot, s.svg, is redrawn with this sweep's points only" in err
    assert "another nestplan" not in err  # (the same build wrote it)


def test_rows_another_nestplan_wrote_are_moved_aside(tmp_path, capsys, monkeypatch):
    """A results file resumed by another nestplan (an upgrade, an edit of its code) runs every
    point again: the rows of the old cost model move to ``.superseded``, each with the build that
    wrote it, and the note says so (datacenter architects' trials: rows of two cost models had
    sat side by side in one file as one grid's, then, kept as another grid's, each design twice
    in a pivot)."""
    import nestplan
    from nestplan import build
    from nestplan.sweep import run

    text = ('[grid]\nmodel = ["llama3-8b"]\ncluster = ["dgx-h100-ndr"]\ngpus = [8, 16]\n'
            'seq_len = [2048]\nglobal_batch = [64]\n')
    path = _write(tmp_path, text)
    now = build.fingerprint()
    assert re.fullmatch(r"[0-9a-f]{12}", now), now
    code, out, _ = cli("--version")  # (the console script's, another process: the same build)
    assert code == 0 and out == f"nestplan {nestplan.__version__} (build {now})\n"
    old = "0123456789ab"
    monkeypatch.setattr(build, "fingerprint", lambda: old)
    monkeypatch.setattr(run, "fingerprint", lambda: old)
    before = {p.id for p in load(path).points()}
    assert main(["sweep", str(path), "--quiet", "--workers", "1"]) == 0
    monkeypatch.undo()
    assert {p.id for p in load(path).points()}.isdisjoint(before)
    capsys.readouterr()
    # a file moved aside by a nestplan of other columns keeps its own: these go to the next
    (tmp_path / "s.csv.superseded").write_text("id,model,step_time_s\nx,m,1.0\n")
    assert main(["sweep", str(path), "--quiet", "--workers", "1", "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert "0 already done, 2 to run" in out
    assert f"2 rows of {tmp_path / 's.csv'} another nestplan wrote" in err
    assert f"would be moved to {tmp_path / 's.csv.superseded.2'} by the run" in err
    assert main(["sweep", str(path), "--quiet", "--workers", "1"]) == 0
    rows = _rows(tmp_path / "s.csv")
    assert [r["nestplan_build"] for r in rows] == [now, now]
    aside = _rows(tmp_path / "s.csv.superseded.2")
    assert [r["nestplan_build"] for r in aside] == [old, old]
    assert {r["id"] for r in aside} == before
    assert _rows(tmp_path / "s.csv.superseded") == [{"id": "x", "model": "m", "step_time_s": "1.0"}]
    err = capsys.readouterr().err
    assert "2 rows of" in err and "another nestplan wrote" in err
    assert f"moved to {tmp_path / 's.csv.superseded.2'}" in err
    assert "not points of this sweep" not in err


def test_a_changed_catalog_entry_changes_its_points_ids(tmp_path, monkeypatch):
    """A point naming a catalog entry hashes what the entry holds, as for a file, and so does a
    point on the default stack: when a release changes the entry (Qwen3's QK norms, say), a
    resumed sweep runs its points again instead of keeping rows computed for the old model."""
    from dataclasses import replace

    from nestplan.sweep import spec as sweep_spec

    text = ('[grid]\nmodel = ["llama3-8b", "gpt-1p7b"]\ncluster = ["dgx-h100-ndr"]\n'
            'gpus = [16]\nseq_len = [2048]\nglobal_batch = [64]\n')
    path = _write(tmp_path, text)
    before = {p["model"]: p.id for p in load(path).points()}
    real = sweep_spec._model
    monkeypatch.setattr(sweep_spec, "_model", lambda ref: replace(real(ref), qk_norm=True)
                        if ref == "llama3-8b" else real(ref))
    after = {p["model"]: p.id for p in load(path).points()}
    assert after["llama3-8b"] != before["llama3-8b"]
    assert after["gpt-1p7b"] == before["gpt-1p7b"]
    # the default stack, which a grid naming no stack runs on, counts as well
    stack = sweep_spec._stack
    monkeypatch.setattr(sweep_spec, "_stack", lambda ref: replace(stack(ref), matmul_scale=0.5)
                        if ref is None else stack(ref))
    again = {p["model"]: p.id for p in load(path).points()}
    assert again["gpt-1p7b"] != after["gpt-1p7b"]


def test_a_single_model_panel_is_titled_by_its_model(tmp_path):
    """A sweep of one model and one method draws one panel, titled by them (it had been titled
    by the sweep file's name)."""
    from nestplan.sweep.plot import summary_svg

    spec = load(_write(tmp_path, BASE + 'method = ["nest"]\n', "mine.toml"))
    results = [(p, 1000.0 + p["gpus"]) for p in spec.points()]
    root = ET.fromstring(str(summary_svg(spec, results, omitted=0)))
    titles = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")
              if t.get("font-weight") == "600"]
    assert "gpt-1p7b · nest" in titles and "mine" not in titles, titles


def test_the_readme_and_example_sweeps_load(tmp_path):
    """The sweep file the README shows and those in examples/ load, with the points they say they
    have (a NIC upgrade moving every level above the server at once)."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    readme = (root / "README.md").read_text()
    start = readme.index("```toml\n[sweep]") + len("```toml\n")
    shown = load(_write(tmp_path, readme[start:readme.index("```", start)]))
    # 2 models x 5 GPU counts x 2 methods x 2 stacks x 4 pod oversubscriptions x 2 NICs
    assert len(shown.points()) == 320
    assert {lvl for _, levels in shown.networks for lvl, _ in levels} == {"rack", "pod", "aggregation"}
    assert len(load(root / "examples" / "sweep-200.toml").points()) == 200
    assert len(load(root / "examples" / "sweep-small.toml").points()) == 12


def test_a_row_gives_the_uneven_stage_split_as_evaluate_takes_it(tmp_path):
    """Llama 3 8B's 32 blocks on three pipeline stages: the row's stage_layers is the split the
    plan has (blocks per model chunk, as --stage-layers takes them), and without a pipeline all
    32 on the one stage."""
    grid = ('[grid]\nmodel = ["llama3-8b"]\ncluster = ["dgx-h100-ndr"]\ngpus = [24]\n'
            'global_batch = [48]\nmethod = ["nest", "manual"]\n[constraints]\npp = {pp}\nvp = 1\n')
    split = {}
    for pp in (3, 1):
        path = _write(tmp_path, grid.format(pp=pp), f"pp{pp}.toml")
        assert main(["sweep", str(path), "--workers", "1", "--quiet"]) == 0
        rows = {r["method"]: r["stage_layers"] for r in _rows(path.with_suffix(".csv"))}
        split[pp] = rows["nest"]
        if pp == 1:  # whichever method split it (manual leaves it to the even default)
            assert rows["manual"] == "32"
    code, out, err = cli("plan", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", 24,
                         "--global-batch", 48, "--pp", 3, "--vp", 1, "--json")
    assert code == 0, err
    blocks = [sum(b - a for a, b in s["blocks"]) for s in json.loads(out)["stages"]]
    assert split[3] == ",".join(map(str, blocks)) and sum(blocks) == 32
    assert split[1] == "32"


def test_a_results_file_behind_a_link_is_written_through_it(tmp_path):
    """``-o link.csv`` where the link names a results file: the file gets the rows (and resumes
    from them), the link stays a link."""
    path = _write(tmp_path, ONE)
    (tmp_path / "real.csv").write_text("")
    (tmp_path / "link.csv").symlink_to("real.csv")
    for _ in range(2):
        assert main(["sweep", str(path), "-o", str(tmp_path / "link.csv"), "--workers", "1",
                     "--quiet"]) == 0
    assert (tmp_path / "link.csv").is_symlink()
    assert len(_rows(tmp_path / "real.csv")) == 1  # once: the second run resumed


def test_a_level_no_point_crosses_is_noted(tmp_path):
    """DGX H100's leaves hold 256 GPUs: a spine swept with points of at most 256 changes nothing,
    and the sweep says so before it runs (rows alike for that reason alone had read as "the
    spine does not matter"); with a 512-GPU point it does not."""
    grid = ('[grid]\nmodel = ["llama3-8b"]\ncluster = ["dgx-h100-ndr"]\ngpus = [64, {most}]\n'
            '[grid.network.spine]\noversubscription = [1, 2]\n'
            '[grid.networks.nic800]\nspine = {{ bandwidth_GBps = 100 }}\n')
    for most, noted in ((256, True), (512, False)):
        path = _write(tmp_path, grid.format(most=most), f"s{most}.toml")
        code, _, err = cli("sweep", path, "--dry-run")
        assert code == 0, err
        assert ("grid.network.spine: no point crosses this level (points of at most 256 GPUs, "
                "blocks below it of 256)" in err) is noted, err
        assert ("the named networks change nothing" in err) is noted, err


def test_a_dry_run_says_which_points_cannot_be_set_up(tmp_path, capsys):
    """A grid whose points fail only somewhere runs (their error rows say why), but the dry run
    says so first: here the MTP depth on the stack that trains none."""
    path = _write(tmp_path, """
[grid]
model = ["gpt-1p7b"]
cluster = ["dgx-h100-ndr"]
gpus = [8]
stack = ["megatron-core", "deepspeed"]
mtp_layers = [0, 1]
""")
    assert main(["sweep", str(path), "--dry-run"]) == 0
    got = capsys.readouterr()
    assert "4 points, 0 already done, 4 to run" in got.out
    assert "1 point to run cannot be set up; the run records an error row for each" in got.err
    assert "mtp" in got.err.split("cannot be set up")[1]
    # a constraint some points cannot take (torchtitan runs no ZeRO-1; TP 8 on 12 GPUs): the dry
    # run had said nothing of them, and the run recorded their error rows
    path.write_text('[grid]\nmodel = ["llama3-8b"]\ncluster = ["dgx-h100-ndr"]\ngpus = [8, 12]\n'
                    'stack = ["megatron-core", "torchtitan"]\n[constraints]\nzero = 1\ntp = 8\n')
    assert main(["sweep", str(path), "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "3 points to run cannot be set up" in err and "stack torchtitan runs ZeRO stages" in err


def test_a_grid_whose_gpu_counts_the_scale_up_domains_do_not_divide_says_so(tmp_path):
    """72-GPU NVLink racks at 1,024 and 2,048 GPUs: both leave a rack partly filled, which one
    note per cluster says, as plan and evaluate do for one run (a user trial's sweep said
    nothing, and read NVL72 as no help to MoE training); the catalog's 64-GPU racks divide both."""
    from console import cli

    racks = tmp_path / "nvl72.toml"
    racks.write_text('name = "nvl72"\naccelerator = "gb200"\n[[levels]]\nname = "nvlink"\n'
                     'size = 72\nbandwidth_GBps = 900\nlatency_us = 3\n[[levels]]\n'
                     'name = "net"\nbandwidth_GBps = 50\nlatency_us = 10\n')
    grid = ('[grid]\nmodel = ["llama3-70b"]\ncluster = ["nvl72.toml", "gb200-nvl72-ndr"]\n'
            'gpus = [1024, 2048]\nseq_len = [4096]\nglobal_batch = [1024]\n')
    code, _, err = cli("sweep", _write(tmp_path, grid, "racks.toml"), "--dry-run")
    notes = [line for line in err.splitlines() if "do not divide" in line]
    assert code == 0 and len(notes) == 1, err
    assert ("grid: on nvl72, the cluster's nvlink domains hold 72 devices, which do not divide the "
            "1,024 of the job (14 whole and 16 of another)") in notes[0]
    assert notes[0].endswith("(and so for the points of 2,048 GPUs)")


def test_a_row_says_whether_its_groups_straddle_the_scale_up_domains(tmp_path):
    """The straddles_domains column holds what the note says once on stderr, row by row: a job
    the innermost domains do not divide (96 GPUs of 64-GPU racks) straddles them, one they divide
    does not (a datacenter trial's design review read a CSV without the note)."""
    grid = ('[grid]\nmodel = ["llama3-8b"]\ncluster = ["gb200-nvl72-ndr"]\ngpus = [64, 96]\n'
            'seq_len = [2048]\nglobal_batch = [192]\n')
    path = _write(tmp_path, grid)
    assert main(["sweep", str(path), "--quiet", "--workers", "1"]) == 0
    rows = {int(r["gpus"]): r for r in _rows(tmp_path / "s.csv")}
    assert {g: r["straddles_domains"] for g, r in rows.items()} == {64: "false", 96: "true"}


def test_a_plot_of_close_points_spans_them_and_says_where_its_axis_starts():
    """Network designs 1-2 % apart: the y axis spans the points, not 0 upwards, and its label
    says so (a datacenter trial's lines were flat on an axis from 0); points far apart keep the
    axis from 0, unlabelled."""
    from nestplan.svg import line_chart

    def y_ticks(svg) -> list[str]:
        root = ET.fromstring(str(svg))
        return [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")
                if t.get("text-anchor") == "end"]

    close = line_chart([("a", [(8, 10_000.0), (16, 10_150.0)]), ("b", [(8, 10_050.0)])],
                       title="t", xlabel="GPUs", ylabel="tokens/s per GPU")
    assert "0" not in y_ticks(close) and "tokens/s per GPU (axis from 10,000, not 0)" in str(close)
    far = line_chart([("a", [(8, 5_000.0), (16, 10_000.0)])], title="t", xlabel="GPUs",
                     ylabel="tokens/s per GPU")
    assert y_ticks(far)[0] == "0" and "not 0" not in str(far)


def test_a_second_sweep_writing_the_same_file_is_refused(tmp_path):
    """A sweep holds its results file's lock (``.NAME.lock``, flock) while it runs: another
    writing the same file exits 2 at once, naming it (two had each run every point into one
    file: a pipeline engineer's trial); the lock ends with the sweep, which then runs."""
    import fcntl
    import os

    path = _write(tmp_path, SMALL)
    out = path.with_suffix(".csv")
    fd = os.open(out.with_name(f".{out.name}.lock"), os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # (as a running sweep holds it)
        assert one_line_error(*cli("sweep", path, "--quiet"),
                              f"output: got '{out}'; another nestplan sweep is writing it")
        assert not out.exists()
    finally:
        os.close(fd)
    code, _, err = cli("sweep", path, "--quiet")
    assert code == 0, err


def test_progress_gives_a_slow_sweeps_pace_per_minute():
    """A sweep whose points take seconds each shows its pace per minute, not "0.0 points/s"
    beside a valid ETA (a datacenter trial's); a fast one per second."""
    import io

    from nestplan.sweep.run import Progress

    for ran, seconds, pace in ((3, 60.0, "3 points/min"), (1, 60.0, "1 point/min"),
                               (40, 10.0, "4 points/s")):
        out = io.StringIO()
        p = Progress(100, 0, stream=out)
        p.start -= seconds  # (as if started that long ago)
        p.update(ran, 0)
        assert f", {pace}, ETA " in out.getvalue(), out.getvalue()


def test_progress_on_a_closed_stream_ends_the_progress_not_the_sweep():
    """A progress stream whose reader is gone (a closed pipe) stops the progress lines and raises
    nothing: a broken pipe is how a closed stdout ends a command, so one raised here had ended the
    sweep with exit 0 and no summary."""
    from nestplan.sweep.run import Progress

    class Gone:
        writes = 0

        def isatty(self):
            return True

        def write(self, text):
            Gone.writes += 1
            raise BrokenPipeError

        def flush(self):
            pass

    p = Progress(100, 0, stream=Gone())
    p.update(1, 0, force=True)
    assert Gone.writes == 1 and not p.enabled
    p.update(2, 0, force=True)
    p.close()
    assert Gone.writes == 1


def test_rows_say_how_many_measured_runs_stand_behind_them(tmp_path, capsys):
    """Each row carries the model's error on measured runs like its point's, as plan --json's
    measured_error gives it, and the sweep notes an accelerator no measured run stands behind (a
    buyer's trial: MI300X rows beside H200 ones read as equally backed, without a word)."""
    from nestplan import accuracy
    from nestplan.evaluate import scenario_from_names

    path = _write(tmp_path, '[grid]\nmodel = ["gpt-1p7b"]\ncluster = ["dgx-h100-ndr", '
                            '"dgx-h200-ndr"]\ngpus = [8]\nseq_len = [2048]\nglobal_batch = [64]\n')
    assert main(["sweep", str(path), "--workers", "1", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "grid: accelerator h200-sxm-141gb: no measured training run stands behind" in err
    assert "h100-sxm-80gb: no measured" not in err
    rows = {r["cluster"]: r for r in _rows(tmp_path / "s.csv")}
    record = accuracy.measured(scenario_from_names("gpt-1p7b", "dgx-h100-ndr", 8, seq_len=2048,
                                                   global_batch=64))[1]
    assert int(rows["dgx-h100-ndr"]["measured_runs"]) == record.runs > 0
    assert float(rows["dgx-h100-ndr"]["measured_mean_abs_error"]) == pytest.approx(
        record.mean_abs_error)
    assert (rows["dgx-h200-ndr"]["measured_runs"], rows["dgx-h200-ndr"]["measured_mean_abs_error"]
            ) == ("0", "")


def test_a_missing_grid_path_says_where_it_was_looked_for(tmp_path):
    """Grid paths are relative to the sweep file; one given from the working directory is refused
    naming the path it was looked for at (a fuzzing trial's was refused as missing, unexplained)."""
    from console import cli, one_line_error

    (tmp_path / "sw").mkdir()
    sweep = tmp_path / "sw" / "q.toml"
    sweep.write_text('[grid]\nmodel = ["sw/m.json"]\ncluster = ["dgx-h100-ndr"]\ngpus = [8]\n'
                     'seq_len = [4096]\nglobal_batch = [64]\n')
    assert one_line_error(*cli("sweep", "sw/q.toml", "--dry-run", cwd=tmp_path),
                          "grid.model: got 'sw/m.json'; no such file (a path is taken relative "
                          "to the sweep file: sw/sw/m.json)")


def test_a_results_file_saved_by_a_spreadsheet_is_read_as_it_was(tmp_path):
    """A byte-order mark and CRLF line ends, as a spreadsheet saves the CSV, read as the file it
    was: its point done, nothing set aside (a fuzzing trial's BOM had refused the file, its CRLF
    copy had set aside lines of a carriage return alone)."""
    from console import cli

    sweep = tmp_path / "s.toml"
    sweep.write_text('[grid]\nmodel = ["gpt-1p7b"]\ncluster = ["dgx-h100-ndr"]\ngpus = [8]\n'
                     'seq_len = [2048]\nglobal_batch = [64]\n')
    code, out, err = cli("sweep", sweep, "--quiet")
    assert code == 0, err
    results = tmp_path / "s.csv"
    text = results.read_text()
    for saved in ("\ufeff" + text, text.replace("\n", "\r\n"),
                  "\ufeff" + text.replace("\n", "\r\n")):
        results.write_text(saved, newline="")
        code, out, err = cli("sweep", sweep, "--quiet")
        assert code == 0 and "1 already done" in out + err and "cannot be read" not in err, err
