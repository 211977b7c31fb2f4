"""The HTML report: its figures hold what the plan says, and it renders in headless Chromium."""

import dataclasses
import json
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET

import pytest

from nestplan import planfile
from nestplan.cli import main
from nestplan.errors import SpecError
from nestplan.evaluate import evaluate, evaluate_names
from nestplan.report import figures, render
from nestplan.svg import colour

SVG_NS = "{http://www.w3.org/2000/svg}"


def _plan(tmp_path, name="plan.json", **kw):
    args = dict(model="llama3-8b", cluster="nest-h100-spineleaf", gpus=64, tp=2, pp=4, vp=2,
                mbs=1, global_batch=64, seq_len=4096, recompute="selective")
    args.update(kw)
    ev = evaluate_names(args.pop("model"), args.pop("cluster"), args.pop("gpus"), **args)
    path = tmp_path / name
    planfile.save(ev, path)
    return path, ev


def _svgs(html: str) -> dict[str, ET.Element]:
    out = {}
    for m in re.finditer(r"<svg .*?</svg>", html, re.S):
        el = ET.fromstring(m.group(0))
        out[el.get("id")] = el
    return out


def test_figures_hold_the_plan(tmp_path):
    path, ev = _plan(tmp_path)
    pf = planfile.load(path)
    html = render(pf, evaluate(pf.scenario, pf.plan))
    svgs = _svgs(html)
    assert set(svgs) == {"fig-timeline", "fig-placement", "fig-memory", "fig-breakdown"}
    assert f"stack {pf.scenario.stack.name}" in html
    # the highest level each group crosses, as the text output has it (a datacenter trial's)
    for axis, (n, level) in ev.group_levels.items():
        assert f"<td class=l>{axis}</td><td>{n:,}</td><td>{level}</td>" in html
    # timeline: every forward and backward of every micro-batch through every chunk
    ops = [r for r in svgs["fig-timeline"].iter(f"{SVG_NS}rect") if "op" in (r.get("class") or "")]
    assert len(ops) == 2 * ev.micro_batches * ev.plan.pp * ev.plan.vp
    # placement: one cell per device, in its stage's colour family, classed by stage
    cells = [r for r in svgs["fig-placement"].iter(f"{SVG_NS}rect") if r.get("class", "").startswith("d ")]
    assert len(cells) == ev.gpus
    stage_of = {}
    for st in ev.stages:
        for d in st.devices:
            stage_of[d] = st.index
    for r in cells:
        dev = int(r.find(f"{SVG_NS}title").text.split(":")[0].split()[1])
        assert r.get("class") == f"d s{stage_of[dev]}"
    # memory: one stacked bar per stage whose parts add up to the stage's memory
    parts = [r for r in svgs["fig-memory"].iter(f"{SVG_NS}rect") if r.get("class") == "mem"]
    for st in ev.stages:
        tips = [r.find(f"{SVG_NS}title").text for r in parts]
        gib = sum(float(t.split(": ")[1].split()[0]) for t in tips
                  if t.startswith(f"stage {st.index} "))
        assert gib == pytest.approx(st.memory.total / 2**30, abs=0.01 * 6)
    assert "fig-methods" not in html  # not from compare
    # the timeline's idle share is every stage's, beside the breakdown's bubble of the slowest (a
    # DeepSeek-V3 trial's team read 19.8 % idle against a 4.3 % bubble)
    from nestplan.units import fmt_time

    assert ("of all stages&#x27; time idle (stages faster than the slowest wait too; the breakdown&#x27;s "
            f"bubble is the slowest stage&#x27;s, {fmt_time(ev.time.bubble)})") in html


def test_timeline_schedule_agrees_with_the_closed_form(tmp_path):
    _, ev = _plan(tmp_path)
    ops = ev.schedule_ops()
    span = max(o.end for o in ops)
    # the simulated schedule (with transfers on the critical path) and the cost model's closed
    # form differ only by the steady-state transfers, which are small against compute here
    closed = ev.step_time - ev.scenario.stack.step_overhead - max(s.end for s in ev.stages)
    assert span == pytest.approx(closed, rel=0.03)


def test_long_schedules_show_fill_and_drain(tmp_path):
    _, ev = _plan(tmp_path, vp=1, global_batch=1024)
    svg, numbers = figures.timeline(ev)
    assert numbers["elided"] and numbers["ops"] == 2 * ev.micro_batches * ev.plan.pp
    drawn = str(svg).count('class="op ')
    assert 0 < drawn < numbers["ops"]


def test_compare_saves_methods_and_report_shows_them(tmp_path, capsys):
    path = tmp_path / "cmp.json"
    assert main(["compare", "--model", "llama3-8b", "--cluster", "nest-h100-spineleaf",
                 "--gpus", "16", "--global-batch", "32", "--seq-len", "4096",
                 "--save", str(path)]) == 0
    pf = planfile.load(path)
    rows = pf.comparison["methods"]
    assert {r["method"] for r in rows} | set(pf.comparison["errors"]) >= {"nest", "manual"}
    best = max(r["tokens_per_s"] for r in rows)
    assert pf.predicted["tokens_per_s"] == pytest.approx(best)
    out = tmp_path / "r.html"
    capsys.readouterr()
    assert main(["report", str(path), "-o", str(out)]) == 0
    svgs = _svgs(out.read_text())
    bars = [r for r in svgs["fig-methods"].iter(f"{SVG_NS}rect") if r.get("class") == "method"]
    assert len(bars) == len(rows)
    chosen = [r for r in bars if r.get("fill") == colour(0)]
    assert len(chosen) == 1 and chosen[0].find(f"{SVG_NS}title").text.startswith(pf.method)
    # every method's whole plan: a user trial found recompute, sp and the split left out
    table = out.read_text().split("<h2>Methods compared</h2>")[1]
    for r in rows:
        cell = f"recompute={r['recompute']}"
        assert cell in table and f"sp={'on' if r['sp'] else 'off'}" in table
        assert (f"schedule={r['schedule']}" in table) == (r["schedule"] is not None)
    # rows that disagree with the file's own method, whose plan it holds, are refused (a seventh
    # fuzzing round's: each had been reported)
    data = json.loads(path.read_text())
    own = next(i for i, r in enumerate(rows) if r["method"] == pf.method)
    other = next(i for i, r in enumerate(rows) if r["method"] != pf.method)

    def edited(change) -> str:
        d = json.loads(json.dumps(data))
        change(d["comparison"])
        return json.dumps(d)

    def faster(c):
        r, f = c["methods"][other], 0.5 * rows[own]["step_time_s"] / rows[other]["step_time_s"]
        r.update(step_time_s=r["step_time_s"] * f, tokens_per_s=r["tokens_per_s"] / f,
                 mfu=r["mfu"] / f)

    def slower(c):  # as an earlier nestplan's cost model could have found every plan
        for r in c["methods"]:
            r.update(step_time_s=r["step_time_s"] * 1.1, tokens_per_s=r["tokens_per_s"] / 1.1,
                     mfu=r["mfu"] / 1.1)

    assert planfile.from_dict(json.loads(edited(slower))).comparison is not None

    def faster_without_fitting(c):  # compare keeps the fastest of the plans that fit
        faster(c)
        c["methods"][other].update(fits=False, peak_memory_gib=1000.0)

    assert planfile.from_dict(json.loads(edited(faster_without_fitting))).comparison is not None
    for change, needle in (
            (lambda c: c["methods"].pop(own), f"has no row of the file's method {pf.method}"),
            (lambda c: c["methods"][own].update(mbs=rows[own]["mbs"] + 1), ".mbs: got "),
            (lambda c: c["errors"].update({pf.method: "boom"}), "a method has a row or an error"),
            (faster, "no row may beat it")):
        with pytest.raises(SpecError, match=re.escape(needle)):
            planfile.from_dict(json.loads(edited(change)))


def test_an_moe_report_names_its_experts_and_workload(tmp_path):
    """The experts as the plan lays them out, the stack's dispatcher and overlap, the workload's
    imbalance, capacity and MTP depths (a user trial found none of them in the report)."""
    path = tmp_path / "moe.json"
    assert main(["evaluate", "--model", "deepseek-v3", "--cluster", "dgx-h100-ndr", "--gpus",
                 "256", "--tp", "1", "--pp", "8", "--ep", "32", "--recompute", "full", "--mbs",
                 "1", "--global-batch", "256", "--seq-len", "4096", "--moe-imbalance", "1.5",
                 "--moe-capacity-factor", "2", "--save", str(path)]) == 0
    pf = planfile.load(path)
    html = render(pf, evaluate(pf.scenario, pf.plan))
    experts = re.sub(r"<[^>]+>", "|", html.split("<h2>Experts</h2>")[1].split("<h2>")[0])
    for words in ("256 routed, 1 shared, top-8", "58 of 61 (+1 MTP depth)",
                  "8 (ep = 32, expert TP 1)", "alltoall", "1.5x the mean", "|2|"):
        assert words in experts, words
    assert "MoE imbalance 1.5 · capacity factor 2 · 1 MTP depth" in html
    assert "60 +head +1 MTP" in html  # (the last stage's row)
    dense = _plan(tmp_path, name="dense.json")[0]
    pf = planfile.load(dense)
    assert "<h2>Experts</h2>" not in render(pf, evaluate(pf.scenario, pf.plan))


def test_report_bad_input_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": 99}')
    assert main(["report", str(bad), "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "format" in err[0]
    path, _ = _plan(tmp_path)
    assert main(["report", str(path), "-o", str(tmp_path / "no" / "such" / "r.html")]) == 2
    assert "-o" in capsys.readouterr().err


# ------------------------------------------------------------------------------ headless Chromium

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _chromium(tmp_path, *args) -> subprocess.CompletedProcess:
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium)")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}"]
    return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=120)


def _dom(tmp_path, html_path) -> str:
    res = _chromium(tmp_path, "--dump-dom", html_path.as_uri())
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


@pytest.mark.chromium
def test_report_renders_in_chromium(tmp_path):
    from PIL import Image

    path, ev = _plan(tmp_path)
    out = tmp_path / "report.html"
    assert main(["report", str(path), "-o", str(out)]) == 0
    dom = _dom(tmp_path, out)
    root = re.search(r"<html[^>]*>", dom).group(0)
    assert 'data-figures="4/4"' in root  # the script ran and every figure drew shapes
    assert "data-errors" not in root
    shot = tmp_path / "shot.png"
    res = _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1200,2200", out.as_uri())
    assert res.returncode == 0 and shot.is_file(), res.stderr[-2000:]
    img = Image.open(shot).convert("RGB")
    assert img.size == (1200, 2200)
    colours = img.getcolors(maxcolors=1 << 20)
    assert len(colours) > 50  # text, figures and shades, not a blank page
    counts = {c: n for n, c in colours}
    # the first two stages' colours fill their devices in the placement figure
    for s in (0, 1):
        rgb = tuple(int(colour(s)[i:i + 2], 16) for i in (1, 3, 5))
        assert counts.get(rgb, 0) > 100, f"stage {s} colour {colour(s)} not on screen"


@pytest.mark.chromium
def test_chromium_check_catches_script_errors(tmp_path):
    path, _ = _plan(tmp_path)
    pf = planfile.load(path)
    html = render(pf, evaluate(pf.scenario, pf.plan))
    broken = tmp_path / "broken.html"
    broken.write_text(html.replace("</body>", "<script>undefinedFunction();</script></body>"))
    root = re.search(r"<html[^>]*>", _dom(tmp_path, broken)).group(0)
    assert "data-errors" in root and "undefinedFunction" in root


@pytest.mark.parametrize("schedule,vp", [("zb-h1", 1), ("interleaved-zb", 2), ("zbv", 2),
                                         ("dualpipev", 2)])
def test_timeline_draws_each_schedules_operations(tmp_path, schedule, vp):
    """The report's timeline runs the plan's own schedule: weight gradients apart (W), whole
    backwards (X) where DualPipeV keeps them, every chunk on the device the schedule places it
    on, and a span within the closed form's stated bound."""
    from dataclasses import replace

    from nestplan.catalog import get_stack
    from nestplan.schedule import SCHEDULES

    from nestplan.evaluate import scenario_from_names
    from nestplan.specs import Parallelism

    stack = replace(get_stack("torchtitan"), schedules=tuple(SCHEDULES))
    sc = replace(scenario_from_names("llama3-8b", "nest-h100-spineleaf", 64, seq_len=4096,
                                     global_batch=64), stack=stack)
    ev = evaluate(sc, Parallelism(tp=2, pp=4, dp=8, vp=vp, mbs=1, zero=3, schedule=schedule))
    assert ev.plan.pipeline.name == schedule
    ops = ev.schedule_ops()
    kinds = {o.kind for o in ops}
    assert "W" in kinds and ("X" in kinds) == (schedule == "dualpipev")
    for o in ops:
        assert ev.plan.pipeline.device_of(o.chunk, ev.plan.pp) == o.stage
    svg, numbers = figures.timeline(ev)
    assert 'class="op W"' in str(svg) and numbers["ops"] == len(ops)
    span = max(o.end for o in ops)
    closed = ev.step_time - ev.scenario.stack.step_overhead - max(s.end for s in ev.stages)
    assert 0.91 <= closed / span <= 1.22


def test_an_moe_plans_devices_name_their_expert_ranks_and_the_legend_only_its_parts(tmp_path):
    """Hovering a device of an MoE plan shows its place in the folded expert grid as well (the
    same groups as the placement's expert grid); the breakdown's legend lists only the parts the
    step has."""
    from nestplan.placement import expert_grid, rank_grid

    path, ev = _plan(tmp_path, model="mixtral-8x7b", cluster="dgx-h100-ndr", gpus=64, tp=2, pp=2,
                     vp=1, ep=8, etp=1, sp=True, recompute="full", global_batch=128)
    pf = planfile.load(path)
    svgs = _svgs(render(pf, evaluate(pf.scenario, pf.plan)))
    tips = {int(t.split(":")[0].split()[1]): t for r in svgs["fig-placement"].iter(f"{SVG_NS}rect")
            if (r.get("class") or "").startswith("d ")
            for t in [r.find(f"{SVG_NS}title").text]}
    egrid = expert_grid(rank_grid(ev.plan), ev.plan)
    for group in egrid[0].reshape(-1, 8):  # stage 0's EP groups of 8
        ranks = sorted(int(tips[int(d)].split("ep rank ")[1].split(",")[0]) for d in group)
        assert ranks == list(range(8))
    # the legend's labels (the bar's own labels are white, the title starts "one step")
    legend = {t.text for t in svgs["fig-breakdown"].iter(f"{SVG_NS}text")
              if t.get("fill") != "#fff" and not t.text.startswith("one step")}
    shown = {f.name for f in dataclasses.fields(ev.time) if getattr(ev.time, f.name) > 0}
    assert legend == shown and "cp" not in legend  # no context parallelism in this plan


def test_the_report_gives_the_notes_evaluate_gives(tmp_path):
    """The page carries the notes ``evaluate --plan`` prints (a hardware trial's report of an MoE
    plan that does not fit at a trained router's load said nothing of it, though the command
    line had); a plan with nothing to say gets no Notes section."""
    from console import cli

    path = tmp_path / "q.json"
    code, _, err = cli("evaluate", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100-ndr",
                       "--gpus", 16, "--tp", 1, "--pp", 1, "--ep", 8, "--mbs", 1, "--global-batch",
                       256, "--seq-len", 4096, "--save", path)
    assert code == 0 and "costed with perfectly balanced routing" in err, err
    code, _, said = cli("evaluate", "--plan", path)
    notes = [ln.removeprefix("nestplan: note: ") for ln in said.splitlines()
             if ln.startswith("nestplan: note: ")]
    code, _, err = cli("report", path, "-o", tmp_path / "q.html")
    assert code == 0, err
    html = (tmp_path / "q.html").read_text()
    section = html.split("<h2>Notes</h2>")[1].split("</ul>")[0]
    from html import escape

    assert notes and section == "<ul>" + "".join(f"<li>{escape(n)}</li>" for n in notes), section
    dense = _plan(tmp_path, name="dense.json")[0]
    code, _, err = cli("report", dense, "-o", tmp_path / "d.html")
    assert code == 0 and ("<h2>Notes</h2>" in (tmp_path / "d.html").read_text()) == (
        "nestplan: note:" in cli("evaluate", "--plan", dense)[2])
