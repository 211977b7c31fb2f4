"""Plan files and the launch configurations exported from them.

Tests marked ``frameworks`` parse the exports with the frameworks' own configuration code and
need the ``frameworks`` extra (torch CPU, megatron-core, deepspeed, torchtitan), which CI
installs; without it they are skipped.
"""

import json
import os
from pathlib import Path

import pytest

from nestplan import planfile
from nestplan.axes import Axis
from nestplan.cli import main
from nestplan.errors import SpecError
from nestplan.evaluate import evaluate, scenario_from_names
from nestplan.exports import export
from nestplan.options import Recompute
from nestplan.placement import rank_grid
from nestplan.specs import Parallelism

N, S, F = Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL


def plans():
    """Plans with the features exports must carry: non-uniform and interleaved stages,
    per-stage recomputation, MoE, CP, ZeRO, a non-Megatron rank order."""
    gpt = scenario_from_names("gpt3-175b", "nest-h100-spineleaf", 128, seq_len=2048,
                              global_batch=256)
    llama = scenario_from_names("llama3-70b", "dgx-h100-ndr", 64, seq_len=8192, global_batch=64)
    mix = scenario_from_names("mixtral-8x7b", "dgx-h100-ndr", 64, seq_len=4096, global_batch=128)
    return [
        (gpt, Parallelism(tp=4, pp=8, dp=4, sp=True, zero=1, vp=3, mbs=1,
                          stage_layers=(5, 4, 4, 4, 4, 4, 4, 3) * 3,
                          recompute=(S,) + (N,) * 7)),
        (llama, Parallelism(tp=2, pp=4, dp=2, cp=4, sp=True, zero=3, mbs=1,
                            stage_layers=(19, 21, 21, 19), recompute=(F, F, N, N),
                            rank_order=(Axis.TP, Axis.CP, Axis.PP, Axis.DP))),
        (mix, Parallelism(tp=2, pp=2, dp=16, ep=8, etp=1, sp=True, zero=2, mbs=1,
                          recompute=(N,))),
    ]


@pytest.fixture(params=range(3), ids=["gpt3-interleaved", "llama3-cp-order", "mixtral-ep"])
def plan_file(request, tmp_path):
    sc, par = plans()[request.param]
    ev = evaluate(sc, par)
    path = tmp_path / "plan.json"
    planfile.save(ev, path, method="test")
    return planfile.load(path), ev


def test_plan_file_round_trip(plan_file):
    pf, ev = plan_file
    assert pf.plan.stage_layers is not None
    again = evaluate(pf.scenario, pf.plan)
    assert again.step_time == pytest.approx(ev.step_time, rel=1e-12)
    assert pf.predicted["step_time_s"] == pytest.approx(ev.step_time)
    assert pf.method == "test" and pf.scenario.cluster == ev.scenario.cluster


def test_plan_file_lists_every_replicas_devices(plan_file):
    pf, ev = plan_file
    data = planfile.to_dict(ev)
    par = pf.plan
    grid = rank_grid(par)  # [pp, dp, cp, tp]
    for st, mine in zip(data["stages"], ev.stages):
        assert len(st["replicas"]) == par.dp
        assert sorted(d for rep in st["replicas"] for d in rep) == list(mine.devices)
        for d, rep in enumerate(st["replicas"]):
            assert rep == sorted(int(x) for x in grid[mine.index, d].ravel())
            assert len(rep) == par.tp * par.cp


def test_plan_file_rejects_other_versions_unknown_keys_and_edits(tmp_path):
    sc, par = plans()[0]
    data = planfile.to_dict(evaluate(sc, par))
    with pytest.raises(SpecError, match="format: got 2; this nestplan .* reads plan files of "
                                        "format 1"):
        planfile.from_dict({**data, "format": 2})
    with pytest.raises(SpecError, match="unknown key"):
        planfile.from_dict({**data, "colour": "blue"})
    bad_plan = dict(data, plan={**data["plan"], "tp": 3})
    with pytest.raises(SpecError, match="tp"):
        planfile.from_dict(bad_plan)
    stages = [dict(s) for s in data["stages"]]
    stages[0]["replicas"] = stages[1]["replicas"]
    with pytest.raises(SpecError, match=r"stages\[0\].replicas.*rank order gives"):
        planfile.from_dict(dict(data, stages=stages))
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(dict(data, plan={**data["plan"], "stage_layers": [1, 2]})))
    code = main(["evaluate", "--plan", str(p)])
    assert code == 2


@pytest.mark.parametrize("fmt", ["megatron", "torchtitan", "deepspeed"])
def test_every_format_exports(plan_file, fmt):
    pf, _ = plan_file
    out = export(pf, fmt)
    assert out.text.strip()
    if pf.plan.recompute and len(set(pf.plan.recompute)) > 1:
        assert any("per-stage recomputation" in n for n in out.notes)


def test_megatron_arguments(plan_file):
    pf, _ = plan_file
    text = export(pf, "megatron").text
    par = pf.plan
    assert f"--tensor-model-parallel-size {par.tp}" in text
    assert f"--pipeline-model-parallel-size {par.pp}" in text
    assert f"--context-parallel-size {par.cp}" in text
    assert ("--sequence-parallel" in text) == par.sp
    if pf.scenario.model.moe is not None:
        assert f"--expert-model-parallel-size {par.ep}" in text
        assert f"--expert-tensor-parallel-size {par.expert_tp}" in text
    if par.vp > 1 or len(set(par.stage_layers)) > 1:
        assert ("--pipeline-model-parallel-layout" in text
                or "--decoder-first-pipeline-num-layers" in text
                or "--num-layers-per-virtual-pipeline-stage" in text)


def test_cli_export_writes_extras(tmp_path, capsys):
    sc, par = plans()[1]
    path = tmp_path / "plan.json"
    planfile.save(evaluate(sc, par), path)
    out = tmp_path / "megatron.args"
    assert main(["export", str(path), "--format", "megatron", "-o", str(out)]) == 0
    assert out.exists() and (tmp_path / "megatron.args.ranks.csv").exists()
    err = capsys.readouterr().err
    assert "rank order (tp-cp-pp-dp) differs from Megatron" in err
    assert main(["export", str(path), "--format", "slurm"]) == 2


# --------------------------------------------------------------- the frameworks' own parsers

frameworks = pytest.mark.frameworks


def check_megatron(pf, text: str, ranks: bool = True):
    """Megatron-Core parses the layout, and (``ranks``) its rank generator mapped through the
    exported rank map gives the plan's TP, PP and DP groups."""
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.pipeline_parallel_layer_layout import (
        PipelineParallelLayerLayout)

    from nestplan.exports.megatron import rank_map

    par = pf.plan
    if "--pipeline-model-parallel-layout" in text:
        layout = text.split("--pipeline-model-parallel-layout '")[1].split("'")[0]
        parsed = PipelineParallelLayerLayout(layout, par.pp)
        assert parsed.virtual_pipeline_model_parallel_size == par.vp
    if not ranks:
        return
    device_of = {int(r): int(d) for r, d, *_ in (
        line.split(",") for line in rank_map(par, 8).splitlines()[1:])}
    gen = ps.RankGenerator(tp=par.tp, ep=1, dp=par.dp, pp=par.pp, cp=par.cp,
                           order="tp-cp-ep-dp-pp")
    grid = rank_grid(par)  # [pp, dp, cp, tp]
    want = {"tp": grid.reshape(-1, par.tp), "pp": grid.transpose(1, 2, 3, 0).reshape(-1, par.pp),
            "dp": grid.transpose(0, 2, 3, 1).reshape(-1, par.dp)}
    for axis, groups in want.items():
        mine = sorted(sorted(int(d) for d in g) for g in groups)
        theirs = sorted(sorted(device_of[r] for r in g) for g in gen.get_ranks(axis))
        assert theirs == mine, axis


def check_torchtitan(pf):
    from torchtitan.config import configs

    from nestplan.exports.torchtitan import sections

    out, _, _ = sections(pf)
    par = configs.ParallelismConfig(**out["parallelism"])
    assert par.tensor_parallel_degree == pf.plan.tp
    assert par.pipeline_parallel_degree == pf.plan.pp
    assert par.context_parallel_degree == pf.plan.cp
    train = configs.TrainingConfig(**out["training"])
    assert train.global_batch_size == pf.scenario.training.global_batch


def check_deepspeed(pf, text: str, monkeypatch):
    from deepspeed.runtime import config as ds_config

    # as on rank 0 of an initialised job, so that DeepSpeed asks the MPU for the DP size
    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)

    class MPU:  # the data-parallel group size DeepSpeed asks a model-parallel unit for
        def get_data_parallel_world_size(self):
            return pf.plan.dp

        def get_model_parallel_world_size(self):
            return pf.plan.tp

        def get_data_parallel_rank(self):
            return 0

        def get_model_parallel_rank(self):
            return 0

    cfg = ds_config.DeepSpeedConfig(json.loads(text), mpu=MPU())
    assert cfg.train_batch_size == pf.scenario.training.global_batch
    assert cfg.train_micro_batch_size_per_gpu == pf.plan.mbs
    assert cfg.zero_optimization_stage == pf.plan.zero


@frameworks
def test_megatron_core_accepts_layout_and_rank_map(plan_file):
    pytest.importorskip("megatron.core")
    check_megatron(plan_file[0], export(plan_file[0], "megatron").text)


@frameworks
def test_torchtitan_accepts_sections(plan_file):
    pytest.importorskip("torchtitan.config.configs")
    check_torchtitan(plan_file[0])


@frameworks
def test_deepspeed_accepts_config(plan_file, monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("deepspeed.runtime.config")
    check_deepspeed(plan_file[0], export(plan_file[0], "deepspeed").text, monkeypatch)


PAPER_PLANS = Path(__file__).parent.parent / "benchmarks" / "paper_plans.json"


@frameworks
def test_every_paper_scenario_plan_exports_and_parses(monkeypatch):
    """Every method's plan of every NEST-paper scenario (written by
    benchmarks/paper_scenarios.py) exports to all three formats, which the frameworks accept."""
    for mod in ("megatron.core", "torchtitan.config.configs", "deepspeed.runtime.config"):
        pytest.importorskip(mod)
    rows = json.loads(PAPER_PLANS.read_text())
    assert len(rows) >= 40
    shapes = set()  # Megatron's rank generator is slow: check each distinct mesh once
    for row in rows:
        sc = scenario_from_names(row["model"], row["cluster"], row["gpus"],
                                 seq_len=row["seq_len"], global_batch=row["global_batch"])
        ev = evaluate(sc, planfile.plan_from_dict(row["plan"]))
        pf = planfile.from_dict(planfile.to_dict(ev, method="paper"))
        text = {fmt: export(pf, fmt).text for fmt in ("megatron", "torchtitan", "deepspeed")}
        assert all(t.strip() for t in text.values())
        par = pf.plan
        shape = (par.tp, par.pp, par.dp, par.cp, par.rank_order)
        check_megatron(pf, text["megatron"], ranks=shape not in shapes)
        shapes.add(shape)
        check_torchtitan(pf)
        check_deepspeed(pf, text["deepspeed"], monkeypatch)


def _mesh_worker(rank, world, store_dir, mesh_path, out_dir):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    dist.init_process_group("gloo", init_method=f"file://{store_dir}/store", rank=rank,
                            world_size=world)
    spec = json.loads(open(mesh_path).read())
    mesh = DeviceMesh("cpu", torch.tensor(spec["ranks"]), mesh_dim_names=tuple(spec["dims"]))
    groups = {d: sorted(dist.get_process_group_ranks(mesh.get_group(d))) for d in spec["dims"]}
    with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
        json.dump(groups, f)
    dist.barrier()
    dist.destroy_process_group()


@frameworks
def test_gloo_mesh_puts_every_rank_in_the_plans_groups(tmp_path):
    mp = pytest.importorskip("torch.multiprocessing")
    sc = scenario_from_names("llama3-8b", "dgx-h100-ndr", 8, seq_len=4096, global_batch=16)
    par = Parallelism(tp=2, pp=2, dp=2, sp=True, zero=1,
                      rank_order=(Axis.TP, Axis.PP, Axis.DP, Axis.CP))
    path = tmp_path / "plan.json"
    planfile.save(evaluate(sc, par), path)
    out = tmp_path / "tt.toml"
    assert main(["export", str(path), "--format", "torchtitan", "-o", str(out)]) == 0
    mesh_path = str(out) + ".mesh.json"
    (tmp_path / "store").mkdir()
    (tmp_path / "out").mkdir()
    mp.start_processes(_mesh_worker, args=(8, tmp_path / "store", mesh_path, tmp_path / "out"),
                       nprocs=8, join=True, start_method="fork")
    grid = rank_grid(par)  # [pp, dp, cp, tp]: rank r runs on device r
    for rank in range(8):
        got = json.loads((tmp_path / "out" / f"{rank}.json").read_text())
        p, d, c, t = (int(i[0]) for i in (grid == rank).nonzero())
        assert got["tp"] == sorted(int(x) for x in grid[p, d, c, :])
        assert got["dp"] == sorted(int(x) for x in grid[p, :, c, t])
        assert got["pp"] == sorted(int(x) for x in grid[:, d, c, t])
