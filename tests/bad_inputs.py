"""The bad-input campaign (issue 11): every subcommand and every file format, as a user mistypes
them. ``test_campaign.py`` runs each case through the installed console script and expects
exit 2, nothing on stdout and one line on stderr that holds the case's ``needle``.

A case's ``files`` are written to a fresh directory first: text, bytes, a function of the base
plan file (a dict, for plan-file variants), ``DIR`` (a directory), ``FIFO`` (a named pipe) or a
``Link`` (a symbolic link to its target, a name in the same directory). ``{name}`` in an argument
is that file's path.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field

DIR, FIFO = object(), object()


@dataclass(frozen=True)
class Link:
    target: str


@dataclass
class Case:
    id: str
    args: list
    needle: str
    files: dict = field(default_factory=dict)


SCENARIO = ["--model", "llama3-8b", "--cluster", "dgx-h100-ndr", "--gpus", "8"]
PLAN = ["--tp", "1", "--pp", "1", "--mbs", "1", "--global-batch", "8", "--seq-len", "2048"]
EVAL = ["evaluate", *SCENARIO, *PLAN]
SEARCH = ["plan", *SCENARIO]
CASES: list[Case] = []


def case(id_, args, needle, **files):
    CASES.append(Case(id_, list(args), needle, files))


# ---- numeric flags of evaluate, plan and compare --------------------------------------------
NUMBERS = {
    "--gpus": (["0", "-8", "1.5", "eight", "nan", str(2**40), "1_6", "\u0661\u0666", "+16"],
               "gpus"),
    "--seq-len": (["0", "-1", "2k", "inf", str(10**9)], "seq-len"),
    "--global-batch": (["0", "-8", "many", "1e3"], "global-batch"),
    "--moe-imbalance": (["0", "-1", "0.5", "nan", "inf", "x"], "moe-imbalance"),
    "--moe-capacity-factor": (["0", "-1", "nan", "x"], "moe-capacity-factor"),
    "--memory-headroom": (["-1", "50", "100", "nan", "x", "1_0"], "memory-headroom"),
    "--attention-span": (["0", "-1", "1.5", str(2**40), "x"], "attention-span"),
}
def _without(args: list, flag: str) -> list:
    """``args`` without ``flag`` and its value."""
    if flag not in args:
        return list(args)
    i = args.index(flag)
    return args[:i] + args[i + 2:]


for flag, (values, name) in NUMBERS.items():
    for v in values:
        case(f"evaluate{flag}={v}", [*_without(EVAL, flag), flag, v], name)
        if flag in ("--gpus", "--memory-headroom", "--moe-imbalance", "--attention-span"):
            case(f"plan{flag}={v}", [*_without(SEARCH, flag), flag, v], name)

# a flag's prefix is not taken for the flag (a user trial's --glob 512 had been --global-batch)
for args in ([*_without(SEARCH, "--global-batch"), "--glob", "512"],
             [*EVAL, "--moe-cap", "1.25"], ["sweep", "--work", "1", "x.toml"]):
    case(f"{args[0]}-abbreviated-{args[-2]}", args, f"unrecognized arguments: {args[-2]}"
         if args[0] != "sweep" else "unrecognized arguments: --work")

# a flag given twice is not the last one taken silently (a user trial's --tp 2 ... --tp 4)
case("evaluate-tp-twice", [*EVAL, "--tp", "4"], "--tp given twice (--tp 1, then --tp 4); give it once")
case("plan-seq-len-twice", [*SEARCH, "--seq-len=4096", "--seq-len", "8192"],
     "--seq-len given twice")
# two flags of one setting (a review's: --sp --no-sp had run without sp)
case("evaluate-sp-and-no-sp", [*_without(EVAL, "--tp"), "--tp", "2", "--sp", "--no-sp"],
     "--sp and --no-sp both given (--sp, then --no-sp); give one")

PLAN_FLAGS = {
    "--tp": ["0", "-1", "3", "two", "1024"],
    "--pp": ["0", "-2", "3", "64"],
    "--dp": ["0", "3", "-8"],
    "--cp": ["0", "3", "-1"],
    "--ep": ["0", "2", "-1"],
    "--etp": ["0", "3"],
    "--vp": ["0", "-1", "3"],
    "--zero": ["4", "-1", "x", "1.5"],
    "--mbs": ["0", "-1", "16", "x"],
}
for flag, values in PLAN_FLAGS.items():
    for v in values:
        case(f"evaluate{flag}={v}", [*_without(EVAL, flag), flag, v], flag.lstrip("-"))
for flag in ("--tp", "--pp", "--cp", "--zero", "--mbs", "--vp"):
    for v in ("5" if flag == "--zero" else "0", "-1", "x"):
        case(f"plan{flag}={v}", [*SEARCH, flag, v], flag.lstrip("-"))

for v in ("fp4", "", "int8", "BF-16"):
    case(f"evaluate--precision={v!r}", [*EVAL, "--precision", v], "precision")
    case(f"plan--precision={v!r}", [*SEARCH, "--precision", v], "precision")
for v in ("nope", "1f1b,zbv", "", "interleaved"):
    case(f"evaluate--schedule={v!r}", [*EVAL, "--schedule", v], "schedule")
    case(f"plan--schedule={v!r}", [*SEARCH, "--schedule", v], "schedule")
case("evaluate--schedule-without-pp", [*EVAL, "--schedule", "zbv"], "schedule")
for v in ("gpipe", "1f1b", "interleaved-1f1b", "interleaved-zb"):  # (had been dropped silently)
    case(f"evaluate--schedule-{v}-without-pp", [*EVAL, "--schedule", v],
         f"schedule: got '{v}'; a pipeline schedule needs --pp > 1")
for v in ("sometimes", "", "full,,none", "none,", "FULL"):
    case(f"evaluate--recompute={v!r}", [*EVAL, "--recompute", v], "recompute")
    case(f"plan--recompute={v!r}", [*SEARCH, "--recompute", v], "recompute")
for v in ("none*0,full", "none*x", "*3", "full*5000", "none*-1", "none*\u00b2"):  # name*k: k stages in a row
    case(f"evaluate--recompute={v!r}", [*EVAL, "--recompute", v], "name*k")
    case(f"plan--recompute={v!r}", [*SEARCH, "--recompute", v], "name*k")
for v in ("tp-tp-dp-pp", "dp", "tp-cp-dp-xx", "", "tp-cp-dp-pp-pp"):
    case(f"evaluate--rank-order={v!r}", [*EVAL, "--rank-order", v], "rank-order")
for v in ("0", "-1", "101", "x", "100000"):
    case(f"plan--top={v}", [*SEARCH, "--top", v], "top")
    case(f"compare--top={v}", ["compare", *SCENARIO, "--top", v], "top")
for v in ("genetic", "", "NEST "):
    case(f"plan--method={v!r}", [*SEARCH, "--method", v], "method")
for name in ("nope", "llama-9", "", "../etc/passwd"):
    case(f"evaluate--model={name!r}", ["evaluate", "--model", name, *SCENARIO[2:], *PLAN],
         "model")
    case(f"evaluate--cluster={name!r}", ["evaluate", "--model", "llama3-8b", "--cluster", name,
                                        "--gpus", "8", *PLAN], "cluster")
    case(f"evaluate--stack={name!r}", [*EVAL, "--stack", name], "stack")
case("evaluate-missing-model", ["evaluate", "--cluster", "dgx-h100-ndr", "--gpus", "8", *PLAN],
     "model")
case("evaluate-missing-plan-flags", ["evaluate", *SCENARIO], "missing")
case("evaluate-too-many-gpus-for-cluster", ["evaluate", "--model", "llama3-8b", "--cluster",
                                            "dgx-h100-ndr", "--gpus", str(2**21), *PLAN], "gpus")
# torchtitan splits each KV head whole (Megatron-Core gathers the projection instead)
case("evaluate-tp-beyond-kv-heads-on-torchtitan",
     ["evaluate", "--model", "llama3-70b", "--cluster", "dgx-h100-ndr", "--gpus", "16", "--tp",
      "16", "--pp", "1", "--mbs", "1", "--global-batch", "16", "--seq-len", "4096", "--stack",
      "torchtitan"], "must divide kv_heads = 8 on stack torchtitan")
case("evaluate-default-zero-with-pp-beyond-the-stack",
     [*EVAL, "--stack", "{z}.toml"], "and at most max_zero_with_pp (1)",
     **{"z.toml": 'base = "deepspeed"\nname = "z"\ndefault_zero_with_pp = 3\n'})
case("plan-contradiction-tp-pp-dp", [*SEARCH[:-1], "64", "--tp", "8", "--pp", "8", "--dp", "8"],
     "must divide gpus")
# the degree named is the one that stops the product dividing gpus (it had always been tp)
case("evaluate-cp-breaks-the-division", ["evaluate", "--model", "llama3-8b", "--cluster",
                                         "dgx-h100-ndr", "--gpus", "64", "--tp", "8", "--pp", "2",
                                         "--cp", "3", "--mbs", "1", "--global-batch", "64",
                                         "--seq-len", "6144"],
     "cp: got 3; tp·pp·cp = 8·2·3 = 48 must divide gpus = 64")
case("plan-tp-within-node", [*SEARCH[:-1], "64", "--tp", "16", "--tp-within-node"],
     "tp-within-node")
case("plan-sp-without-tp", [*SEARCH, "--tp", "1", "--sp"], "sp")
# a fixed vp above the free search's 8 is searched (Megatron runs any count that leaves each chunk
# a block; it had been refused "at most 8"); one that leaves a chunk without a block is refused
case("plan-vp-over-the-limit", [*SEARCH, "--vp", "17"], "vp: got 17; must be at most layers / 2 = 16")
# an expert grid the GPUs cannot hold, named by the degree given (it had been exit 3, "no
# configuration satisfies the constraints {'etp': 64}"; evaluate had named ep = 1, the default)
MIXTRAL_32 = ["--model", "mixtral-8x7b", "--cluster", "dgx-h100-ndr", "--gpus", "32"]
for etp in ("64", "3"):
    case(f"plan-etp-{etp}-beyond-the-grid", ["plan", *MIXTRAL_32, "--etp", etp],
         f"etp: got {etp}; etp·ep = {etp}·1 must divide tp·cp·dp, a divisor of gpus = 32")
case("plan-etp-ep-beyond-the-grid", ["plan", *MIXTRAL_32, "--ep", "8", "--etp", "8"],
     "ep: got 8; etp·ep = 8·8 must divide tp·cp·dp, a divisor of gpus = 32")
case("evaluate-etp-names-etp", ["evaluate", *MIXTRAL_32, "--tp", "2", "--pp", "4", "--etp", "3",
                                "--mbs", "1", "--seq-len", "4096", "--global-batch", "256"],
     "etp: got 3; etp·ep = 3·1 must divide tp·cp·dp = 8")
# etp not given is tp's, which the refusal says with the etp that folds (a MoE trial's)
case("evaluate-etp-defaulted-to-tp", ["evaluate", "--model", "qwen3-30b-a3b", "--cluster",
                                      "dgx-b200-ndr", "--gpus", "8", "--tp", "2", "--pp", "1",
                                      "--ep", "8", "--mbs", "1", "--seq-len", "4096",
                                      "--global-batch", "64"],
     "ep: got 8; etp·ep = 2·8 must divide tp·cp·dp = 8, the ranks the expert grid folds over; "
     "etp, not given, is tp's 2; etp = 1 folds the experts over the TP ranks")
for method in ("nest", "manual", "exhaustive"):  # had answered exit 3, 'nothing fits'
    case(f"plan-vp-without-pipeline-{method}", [*SEARCH, "--vp", "2", "--pp", "1", "--method",
                                                method], "vp: got 2; virtual stages")
case("plan-more-chunks-than-blocks", [*SEARCH, "--pp", "8", "--vp", "8"], "chunks need")
# knobs the stack cannot run together: mcmc had returned ZeRO-0 plans, the others "nothing fits"
for method in ("nest", "mcmc"):
    case(f"plan-zero-over-the-stacks-pipeline-limit-{method}",
         [*SEARCH, "--stack", "deepspeed", "--zero", "3", "--pp", "2", "--method", method],
         "zero: got 3; stack deepspeed runs at most ZeRO-1 with pipeline parallelism")
# ep in a rank order had been dropped without a word (Megatron's own place for it is accepted)
case("evaluate-rank-order-ep-elsewhere", [*EVAL, "--rank-order", "tp-cp-dp-ep-pp"],
     "ep may appear only just before dp")
case("plan-vp-on-a-stack-without-interleaving", [*SEARCH, "--stack", "deepspeed", "--vp", "2"],
     "no interleaved pipeline schedule")
case("plan-fp8-on-a100", ["plan", "--model", "llama3-8b", "--cluster", "selene-a100-hdr",
                          "--gpus", "8", "--precision", "fp8"], "precision")
case("plan-ep-on-dense", [*SEARCH, "--ep", "2"], "ep")
for method in ("nest", "manual", "mcmc", "exhaustive"):  # had been exit 3 'no configuration'
    case(f"plan-expert-grid-over-the-pipeline-{method}",
         ["plan", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100-ndr", "--gpus", "8", "--tp",
          "1", "--pp", "2", "--etp", "2", "--ep", "4", "--method", method],
         "etp·ep = 2·4 must divide tp·cp·dp = 4 (gpus / pp = 8/2)")
for method in ("nest", "manual"):  # a fixed ep no fold holds (a torchtitan MoE user's trial:
    # exit 3 listing every rule but the one)
    case(f"plan-ep-over-the-pipeline-{method}",
         ["plan", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100-ndr", "--gpus", "16",
          "--stack", "torchtitan", "--ep", "16", "--pp", "2", "--method", method],
         "ep: got 16; must divide tp·cp·dp = 8 (gpus / pp = 16/2), the ranks the expert grid "
         "folds over")
for method in ("nest", "manual", "mcmc"):  # every method refuses it alike, before searching
    case(f"plan-etp-on-dense-{method}", [*SEARCH, "--etp", "2", "--method", method],
         "etp: got 2; llama3-8b has no experts")
case("plan-ep-more-than-experts", ["plan", "--model", "mixtral-8x7b", "--cluster",
                                   "dgx-h100-ndr", "--gpus", "64", "--ep", "16"], "experts")
case("plan-per-stage-without-pp", [*SEARCH, "--recompute", "full,none"], "recompute")
# a recompute module's name is told how a stack file names a set of them (an MoE user's trial)
case("evaluate--recompute-a-module", [*EVAL, "--recompute", "moe_act"],
     "recompute: got 'moe_act'; stack megatron-core offers none, selective, fine-grained, full; "
     "moe_act is a recompute module: a set of them is a policy a stack file names (base = "
     '"megatron-core", then a [recompute] table, which replaces the base\'s, none first: none = '
     '"none", mine = "modules:moe_act,..."')
# MoE layers at tp > 1 need sequence parallelism: on a stack without it the message names tp
# (asking for --sp would only draw "has no sequence parallelism" next)
MIXTRAL = ["--model", "mixtral-8x7b", "--cluster", "dgx-h100-ndr", "--gpus", "64",
           "--global-batch", "256", "--seq-len", "4096", "--tp", "2"]
NO_SP = ('base = "megatron-core"\nname = "no-sp"\naxes = ["tp", "ep", "pp"]\n'
         'default_sp = false\n')
for sub, extra in (("plan", []), ("evaluate", ["--pp", "2", "--mbs", "1"])):
    for sp in ([], ["--no-sp"]):
        case(f"{sub}-moe-tp-stack-without-sp{'-no-sp' if sp else ''}",
             [sub, *MIXTRAL, *extra, *sp, "--stack", "{s}.toml"],
             "tp: got 2; MoE layers with tp > 1 need sequence parallelism, which stack "
             "no-sp does not have", **{"s.toml": NO_SP})
        case(f"{sub}-moe-tp-stack-without-tp{'-no-sp' if sp else ''}",
             [sub, *MIXTRAL, *extra, *sp, "--stack", "composer"],
             "tp: got 2; stack composer has no tensor parallelism")
    # Megatron-LM of 2021-22 had no MoE layers (a user trial's plan had come out at 45 % MFU)
    case(f"{sub}-moe-stack-without-moe", [sub, *MIXTRAL, *extra, "--stack", "megatron-2022"],
         "stack: got 'megatron-2022'; trains no mixture-of-experts layers")
for method in ("nest", "mcmc"):  # a V of chunks for a model whose blocks differ (dense and MoE)
    case(f"plan-v-schedule-mixed-model-{method}",
         ["plan", "--model", "llama4-maverick", "--cluster", "dgx-h100-ndr", "--gpus", "64",
          "--stack", "torchtitan", "--schedule", "zbv", "--vp", "2", "--method", method],
         "places model chunks in a V")
case("plan-interleaving-mixed-model-no-divisor",  # DeepSeek-V3: 61 blocks, dense and MoE
     ["plan", "--model", "deepseek-v3", "--cluster", "dgx-h100-ndr", "--gpus", "64",
      "--schedule", "interleaved-1f1b"], "chunk counts that divide its 61 layers")
# interleaving by the micro-batches per replica (8 GPUs over pp 4: 2 replicas of mbs 1): 9 are
# no whole number of max(1, 9 // 4) = 2 rounds on torchtitan (Megatron-Core runs one round of
# 9); 6 run on Megatron-Core and torchtitan (one round of 6) but not on 2021's Megatron-LM
# (rounds of 4); 3 on torchtitan (one round) but not on Megatron-Core (at least pp)
_PIPE = ["evaluate", *SCENARIO, "--tp", "1", "--pp", "4", "--vp", "2", "--mbs", "1",
         "--seq-len", "2048", "--global-batch"]
case("evaluate-interleaved-rounds-not-whole", [*_PIPE, "18", "--stack", "torchtitan"],
     "micro-batches per replica (global_batch / (mbs·dp)); stack torchtitan runs interleaved-1f1b "
     "in max(1, m // pp) rounds (pp = 4), of which m must be a multiple: 9 makes 2; the nearest "
     "counts it runs are 8 and 10")
case("evaluate-interleaved-rounds-of-pp", [*_PIPE, "12", "--stack", "megatron-2022"],
     "stack megatron-2022 runs interleaved-1f1b in rounds of pp = 4: their count must be a "
     "multiple of 4")
case("evaluate-interleaved-fewer-than-pp", [*_PIPE, "6", "--stack", "megatron-core"],
     "stack megatron-core runs interleaved-1f1b with at least pp = 4 per replica")
case("evaluate-zero-bubble-shorter-last-round",  # Megatron-Core's rounds, torch's schedule
     [*_PIPE, "18", "--stack", "{s}.toml", "--schedule", "interleaved-zb"],
     "schedule interleaved-zb runs whole rounds only, as torch does: rounds of 5 leave a last "
     "one of 4 (pp = 4); a multiple of 4 runs", **{"s.toml": 'base = "megatron-core"\nname = "mc-zb"\n'
                                  'schedules = ["1f1b", "interleaved-1f1b", "interleaved-zb"]\n'})
case("plan-torchtitan-zero1", [*SEARCH, "--stack", "torchtitan", "--zero", "1"], "zero")
case("plan-stack-without-schedule", [*SEARCH, "--stack", "composer", "--pp", "2"], "pp")
case("unknown-subcommand", ["optimise"], "invalid choice")
case("unknown-flag", [*EVAL, "--turbo"],
     "unrecognized arguments: --turbo (see nestplan evaluate --help)")
case("list-unknown", ["list", "gpus"], "invalid choice")
case("list-unknown-stack", ["list", "stacks", "nosuch"], "unknown stack")
# GPT-OSS's sinks under CP need Transformer Engine's a2a, which splits each TP rank's heads over
# the CP ranks: tp 8 leaves one KV head a rank, which cp 4 cannot split (a long-context trial's
# plan had been recommended; only its export said it does not run)
GPT_OSS_CP = ["--model", "gpt-oss-120b", "--cluster", "dgx-b200-ndr", "--gpus", "256",
              "--seq-len", "131072", "--global-batch", "64", "--tp", "8", "--cp", "4"]
for command, extra in (("evaluate", ["--pp", "1", "--mbs", "1", "--ep", "8"]), ("plan", [])):
    case(f"{command}-sinks-cp-over-tp-ranks-kv-heads", [command, *GPT_OSS_CP, *extra],
         "cp: got 4; attention with sinks runs under context parallelism only with Transformer "
         "Engine's a2a exchange, which splits each TP rank's heads over the CP ranks: its 8 query "
         "and 1 KV heads (tp = 8) must divide by cp = 4")
# the one catalog name a short one begins (a hardware trial's "b200" had been told "gb200")
case("list-accelerator-short-name", ["list", "accelerators", "b200"],
     "accelerator: got 'b200'; unknown accelerator (did you mean 'b200-sxm-180gb'?)")
# a HuggingFace id's case for a catalog name (a MoE user's trial): the name is suggested
case("plan-model-in-hf-case", ["plan", "--model", "Qwen3-235B-A22B", "--cluster", "dgx-h100-ndr",
                               "--gpus", "64"],
     "model: got 'Qwen3-235B-A22B'; unknown model (did you mean 'qwen3-235b-a22b'?)")
# a catalog name in another case is that name, not a longer one it begins (a DeepSpeed trial's
# "DeepSpeed" had been told "deepspeed-2021")
case("plan-stack-in-another-case", ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-ndr",
                                    "--gpus", "8", "--stack", "DeepSpeed"],
     "stack: got 'DeepSpeed'; unknown stack (did you mean 'deepspeed'?)")
case("list-model-missing-file", ["list", "models", "{d}/none.toml"], "none.toml'; no such file",
     d=DIR)

# ---- HuggingFace model configs -----------------------------------------------------------------
LLAMA = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 256,
         "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 512,
         "vocab_size": 1000}


def _hf(**changes):
    cfg = dict(LLAMA)
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    return json.dumps(cfg)


DEEPSEEK = {**LLAMA, "model_type": "deepseek_v3", "n_routed_experts": 8, "num_experts_per_tok": 2,
            "moe_intermediate_size": 64, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
            "qk_rope_head_dim": 16, "v_head_dim": 16}
HF_BAD = {
    # JSON keeps the last of a repeated key; a config that says two things is refused
    "key-twice": (_hf()[:-1] + ', "num_hidden_layers": 8}', "key 'num_hidden_layers' is given twice"),
    "layers0": (_hf(num_hidden_layers=0), "num_hidden_layers"),
    # transformers' ACT2FN refuses an unknown name; nestplan models SiLU and GeLU gates only
    "aux-loss-huge": (json.dumps({**LLAMA, "model_type": "mixtral", "num_local_experts": 4,
                                  "num_experts_per_tok": 2, "router_aux_loss_coef": 100}),
                      "router_aux_loss_coef: got 100.0; must be a number in [0, 10]"),
    "mlp-bias-word": (_hf(mlp_bias="yes"), "mlp_bias: got 'yes'; must be true or false"),
    "model-type-number": (json.dumps({**LLAMA, "model_type": 7,
                                      "architectures": ["LlamaForCausalLM"]}),
                          "model_type: got 7; must be a string"),
    "gpt2-positions-huge": (json.dumps({"model_type": "gpt2", "n_layer": 2, "n_embd": 128,
                                        "n_head": 4, "vocab_size": 1000,
                                        "n_positions": 10**20}), "n_positions"),
    "act-unknown": (_hf(hidden_act="wibble"), "hidden_act: got 'wibble'; allowed: silu"),
    "act-relu2": (_hf(hidden_act="relu2"), "hidden_act: got 'relu2'"),
    "act-number": (_hf(hidden_act=3), "hidden_act"),
    # the norms' epsilon, exported (--norm-epsilon): a user trial's three went through
    # one rule's words whatever the value (a negative one had been told ">= 0")
    "eps-negative": (_hf(rms_norm_eps=-1e-6), "rms_norm_eps: got -1e-06; must be a number in (0, "
                     "0.01]"),
    "eps-zero": (_hf(rms_norm_eps=0), "rms_norm_eps: got 0; must be a number in (0, 0.01]"),
    "eps-large": (_hf(rms_norm_eps=5.0), "rms_norm_eps: got 5.0; must be a number in (0, 0.01]"),
    "eps-word": (_hf(rms_norm_eps="1e-6"), "rms_norm_eps: got '1e-6'"),
    "layers-neg": (_hf(num_hidden_layers=-3), "num_hidden_layers"),
    "layers-str": (_hf(num_hidden_layers="four"), "num_hidden_layers"),
    "layers-float": (_hf(num_hidden_layers=4.5), "num_hidden_layers"),
    "layers-huge": (_hf(num_hidden_layers=10**9), "num_hidden_layers"),
    # a field read from a key is named by the key, with the value the file gives
    "window-beyond-sequence": (_hf(model_type="mistral", sliding_window=10**7),
                               "sliding_window: got 10000000; gives local_span = 20000000: at most"),
    "llama4-empty-text-config": (json.dumps({"model_type": "llama4", "text_config": {}}),
                                 "text_config.num_attention_heads: missing key; "
                                 "model_type 'llama4' requires a value"),
    # a key present but null is said to be null (a user trial was told it was missing)
    "heads-null": (json.dumps({**LLAMA, "num_attention_heads": None}),
                   "num_attention_heads: got null; model_type 'llama' requires a "
                   "value"),
    # families that list their layers' kinds as they are read (it had run out of memory)
    "layers-huge-mistral": (_hf(model_type="mistral", num_hidden_layers=2**31),
                            "num_hidden_layers: got 2147483648; at most 512 is supported"),
    "layers-huge-qwen3-moe": (_hf(model_type="qwen3_moe", num_experts=8, num_experts_per_tok=2,
                                  moe_intermediate_size=64, num_hidden_layers=2**31),
                              "num_hidden_layers: got 2147483648; at most 512 is supported"),
    "experts-huge": (_hf(model_type="qwen3_moe", num_experts=2**40, num_experts_per_tok=2,
                         moe_intermediate_size=64), "num_experts: got 1099511627776; at most"),
    "layers-missing": (_hf(num_hidden_layers=None), "num_hidden_layers"),
    "hidden0": (_hf(hidden_size=0), "hidden_size"),
    "hidden-huge": (_hf(hidden_size=10**9), "hidden_size"),
    "hidden-not-heads-multiple": (_hf(hidden_size=250), "hidden_size"),
    "heads0": (_hf(num_attention_heads=0), "num_attention_heads"),
    "kv-not-dividing": (_hf(num_key_value_heads=3), "num_key_value_heads"),
    "kv-more-than-heads": (_hf(num_key_value_heads=8), "num_key_value_heads"),
    "ffn0": (_hf(intermediate_size=0), "intermediate_size"),
    "ffn-null": (json.dumps({**LLAMA, "intermediate_size": None}), "intermediate_size"),
    "vocab0": (_hf(vocab_size=0), "vocab_size"),
    "vocab-bool": (_hf(vocab_size=True), "vocab_size"),
    "unknown-type": (_hf(model_type="mamba"), "model_type"),
    "type-number": (_hf(model_type=7), "model_type"),
    "not-json": ("{model_type: llama", "JSON"),
    "json-array": ("[1, 2, 3]", "JSON object"),
    "json-string": ('"llama"', "JSON object"),
    "empty": ("", "JSON"),
    "nan": (_hf(hidden_size=float("nan")), "hidden_size"),
    "binary": (b"\x00\x01\x02\xff\xfe", "UTF-8"),
    "moe-topk-over-experts": (json.dumps({**LLAMA, "model_type": "mixtral",
                                          "num_local_experts": 2, "num_experts_per_tok": 4}),
                              "num_experts_per_tok"),
    "moe-experts0": (json.dumps({**LLAMA, "model_type": "mixtral", "num_local_experts": 0,
                                 "num_experts_per_tok": 2}), "num_local_experts"),
    "yarn-factor-str": (_hf(rope_scaling={"rope_type": "yarn", "factor": "x"}),
                        "rope_scaling.factor"),
    # Llama 3.1's and linear scalings, kept and exported: transformers' own required keys
    "llama3-rope-no-low": (_hf(rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                             "high_freq_factor": 4.0}),
                           "rope_scaling.low_freq_factor: missing: llama3 RoPE scaling needs it"),
    "llama3-rope-factor-word": (_hf(rope_scaling={"rope_type": "llama3", "factor": "8",
                                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0}),
                                "rope_scaling.factor: got '8'"),
    "llama3-rope-high-below-low": (_hf(rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                     "low_freq_factor": 4.0,
                                                     "high_freq_factor": 1.0,
                                                     "original_max_position_embeddings": 8192}),
                                   "rope_scaling.high_freq_factor: got 1.0; must be a number "
                                   "at least low_freq_factor"),
    "linear-rope-no-factor": (_hf(rope_scaling={"rope_type": "linear"}),
                              "rope_scaling.factor: missing: linear RoPE scaling needs its "
                              "factor"),
    "linear-rope-shrinks": (_hf(rope_scaling={"rope_type": "linear", "factor": 0.5}),
                            "rope_scaling.factor: got 0.5; must be a number in [1"),
    "rope-type-unknown": (_hf(rope_scaling={"rope_type": "bogus", "factor": 8.0}),
                          "rope_scaling.rope_type: got 'bogus'; allowed: default, linear"),
    "rope-type-unknown-v5": (_hf(rope_parameters={"rope_type": "yarnn", "rope_theta": 1e4}),
                             "rope_parameters.rope_type: got 'yarnn'"),
    "rope-type-unknown-old-key": (_hf(rope_scaling={"type": "bogus", "factor": 8.0}),
                                  "rope_scaling.type: got 'bogus'"),
    "yarn-attention-factor-neg": (_hf(rope_scaling={"type": "yarn", "factor": 8,
                                                    "attention_factor": -1}),
                                  "rope_scaling.attention_factor"),
    "yarn-attention-factor-zero": (_hf(rope_scaling={"rope_type": "yarn", "factor": 8,
                                                     "attention_factor": 0}), "rope_scaling"),
    "yarn-not-a-table": (_hf(rope_scaling=[8.0]), "rope_scaling"),
    "yarn-beta-fast-negative": (_hf(rope_scaling={"rope_type": "yarn", "factor": 8,
                                                  "beta_fast": -1}), "rope_scaling.beta_fast"),
    # one rule's words for every factor out of range (a negative one had said ">= 0", 0.5
    # "in [1, ...]": a fuzzing helper's)
    "llama3-rope-factor-negative": (_hf(rope_scaling={"rope_type": "llama3", "factor": -2,
                                                      "low_freq_factor": 1.0,
                                                      "high_freq_factor": 4.0}),
                                    "rope_scaling.factor: got -2; must be a number in [1, 1e+06] "
                                    "(the context extension)"),
    "yarn-factor-zero": (_hf(rope_scaling={"rope_type": "yarn", "factor": 0}),
                         "rope_scaling.factor: got 0; must be a number in [1, 1e+06]"),
    "yarn-factor-below-one": (_hf(rope_scaling={"rope_type": "yarn", "factor": 0.5}),
                              "rope_scaling.factor: got 0.5; must be a number in [1"),
    "yarn-truncate-word": (_hf(rope_scaling={"rope_type": "yarn", "factor": 8, "truncate": "no"}),
                           "rope_scaling.truncate: got 'no'; must be true or false"),
    "yarn-attention-factor-beyond-megatron": (
        _hf(rope_scaling={"rope_type": "yarn", "factor": 1.00000001, "attention_factor": 1.2}),
        "rope_scaling.attention_factor: got 1.2; needs Megatron-Core's mscale at 2e+08"),
    "yarn-mscales-give-too-large-a-scale": (
        _hf(rope_scaling={"rope_type": "yarn", "factor": 8.0, "mscale": 100,
                          "mscale_all_dim": 0.001}),
        "rope_scaling.mscale: got 100.0; gives a scale of RoPE's cos and sin of"),
    "yarn-context-from-max-positions-huge": (
        _hf(rope_scaling={"rope_type": "yarn", "factor": 8}, max_position_embeddings=20000000),
        "cfg.json: max_position_embeddings: got 20000000; at most 16,777,216 tokens"),
    "yarn-original-context-zero": (_hf(rope_scaling={"rope_type": "yarn", "factor": 8,
                                                     "original_max_position_embeddings": 0}),
                                   "original_max_position_embeddings: got 0"),
    "architectures-number": (_hf(model_type="foo", architectures=3), "architectures"),
    "nested-too-deep": ('{"a": ' + "[" * 100000 + "]" * 100000 + "}", "nests too deeply"),
    "number-too-long": ('{"hidden_size": 1' + "0" * 5000 + "}", "too many digits"),
    "mixtral-experts-huge": (json.dumps({**LLAMA, "model_type": "mixtral",
                                         "num_local_experts": 10**300,
                                         "num_experts_per_tok": 2}), "experts"),
    "yarn-factor-huge-int": (_hf(rope_scaling={"rope_type": "yarn", "factor": 10**400}),
                             "(401 characters); must be a number in [1, 1e+06]"),
    "llama4-text-config-null": (json.dumps({"model_type": "llama4", "text_config": None}),
                                "text_config: got null; must be a table"),
    "yarn-type-number": (_hf(rope_scaling={"rope_type": 3, "factor": 8}),
                         "rope_scaling.rope_type"),
    "tied-embeddings-str": (_hf(tie_word_embeddings="yes"), "tie_word_embeddings"),
    "rope-theta-str": (_hf(rope_theta="big"), "rope_theta"),
    "rope-theta-zero": (_hf(rope_theta=0), "rope_theta: got 0; must be a number >= 1"),
    "router-score-unknown": (json.dumps({**DEEPSEEK, "scoring_func": "relu"}),
                             "scoring_func: got 'relu'; allowed: softmax, sigmoid"),
    "router-groups-not-dividing": (json.dumps({**DEEPSEEK, "n_group": 3}),
                                   "n_group: got 3; must divide moe.experts = 8"),
    "router-group-topk-over": (json.dumps({**DEEPSEEK, "n_group": 2, "topk_group": 4}),
                               "topk_group: got 4; must be <= moe.router_groups = 2"),
    "router-bias-with-softmax": (json.dumps({**DEEPSEEK, "scoring_func": "softmax"}),
                                 "topk_method: got 'noaux_tc'; its expert bias balances sigmoid"),
    "router-topk-method-unknown": (json.dumps({**DEEPSEEK, "topk_method": "aux"}),
                                   "topk_method: got 'aux'; allowed: noaux_tc"),
    "router-groups-too-small-for-topk": (json.dumps({**DEEPSEEK, "n_group": 8, "topk_group": 1}),
                                         "n_group: got 8; 1 of them of 1 experts each cannot "
                                         "give top_k = 2 experts"),
    "rope-theta-twice-differently": (_hf(rope_theta=1e6, rope_parameters={"rope_theta": 5e6}),
                                     "rope_parameters.rope_theta: got 5000000.0; differs"),
    # DeepSeek-V2's router has no expert bias (DeepseekV2TopkRouter: greedy or group-limited)
    "v2-router-expert-bias": (json.dumps({**DEEPSEEK, "model_type": "deepseek_v2",
                                          "topk_method": "noaux_tc", "scoring_func": "sigmoid"}),
                              "topk_method: got 'noaux_tc'; allowed: greedy, group_limited_greedy"),
    "v2-groups-not-dividing": (json.dumps({**DEEPSEEK, "model_type": "deepseek_v2",
                                           "topk_method": "group_limited_greedy", "n_group": 3}),
                               "n_group: got 3; must divide moe.experts = 8"),
    "router-scale-negative": (json.dumps({**DEEPSEEK, "routed_scaling_factor": -2.5}),
                              "routed_scaling_factor"),
    "yarn-overflow": (_hf(rope_scaling={"rope_type": "yarn", "factor": 1e308, "mscale": 1e308,
                                        "mscale_all_dim": 1e308}), "rope_scaling"),
    "gpt-oss-swiglu-limit-huge": (json.dumps({**LLAMA, "model_type": "gpt_oss",
                                              "num_local_experts": 4, "num_experts_per_tok": 2,
                                              "swiglu_limit": 1e7}), "swiglu_limit"),
    "gpt-oss-swiglu-limit-str": (json.dumps({**LLAMA, "model_type": "gpt_oss",
                                             "num_local_experts": 4, "num_experts_per_tok": 2,
                                             "swiglu_limit": "seven"}), "swiglu_limit"),
    # lists of layers whose entries had been dropped or read by truthiness
    "gpt-oss-layer-types-unknown": (json.dumps({**LLAMA, "model_type": "gpt_oss",
                                                "num_local_experts": 4, "num_experts_per_tok": 2,
                                                "sliding_window": 128,
                                                "layer_types": ["x"] * LLAMA["num_hidden_layers"]}),
                                    "layer_types: got 'x'; entries allowed"),
    # a window or chunk of 0 tokens masks every key in transformers; it had read as none
    "gpt-oss-window-zero": (json.dumps({**LLAMA, "model_type": "gpt_oss", "num_local_experts": 4,
                                        "num_experts_per_tok": 2, "sliding_window": 0}),
                            "sliding_window: got 0; must be a number of tokens >= 1, or null"),
    "llama4-chunk-zero": (json.dumps({**LLAMA, "model_type": "llama4", "num_local_experts": 4,
                                      "num_experts_per_tok": 1, "attention_chunk_size": 0}),
                          "attention_chunk_size: got 0; must be a number of tokens >= 1"),
    "mistral-window-word": (_hf(model_type="mistral", sliding_window="4k"),
                            "sliding_window: got '4k'; must be an integer"),
    "qwen2-window-flag-word": (_hf(model_type="qwen2", use_sliding_window="yes"),
                               "use_sliding_window: got 'yes'; must be true or false"),
    "qwen2-layer-types-short": (_hf(model_type="qwen2", use_sliding_window=True,
                                    layer_types=["full_attention"]),
                                "layer_types: got '1 entries'; needs one per layer"),
    "qwen3-moe-dense-layer-word": (json.dumps({**LLAMA, "model_type": "qwen3_moe",
                                               "num_experts": 4, "num_experts_per_tok": 2,
                                               "moe_intermediate_size": 64,
                                               "mlp_only_layers": ["a"]}),
                                   "mlp_only_layers: got ['a']; must list layer indices"),
    "qwen3-moe-dense-layer-beyond": (json.dumps({**LLAMA, "model_type": "qwen3_moe",
                                                 "num_experts": 4, "num_experts_per_tok": 2,
                                                 "moe_intermediate_size": 64,
                                                 "mlp_only_layers": [0, 99]}), "mlp_only_layers"),
    "llama4-moe-layers-beyond": (json.dumps({**LLAMA, "model_type": "llama4", "num_local_experts": 4,
                                             "num_experts_per_tok": 1, "moe_layers": [0, 99]}),
                                 "moe_layers: got [0, 99]; must list layer indices"),
    # (the list check's words had offered strings, which the indices refuse)
    "llama4-moe-layers-text": (json.dumps({**LLAMA, "model_type": "llama4", "num_local_experts": 4,
                                           "num_experts_per_tok": 1, "moe_layers": "1,3"}),
                               "moe_layers: got '1,3'; must list layer indices"),
    "llama4-no-rope-interval-zero": (json.dumps({**LLAMA, "model_type": "llama4",
                                                 "num_local_experts": 4, "num_experts_per_tok": 1,
                                                 "no_rope_layer_interval": 0}),
                                     "no_rope_layer_interval: got 0; must be an integer >= 1"),
    "llama4-layer-types-sliding": (json.dumps({**LLAMA, "model_type": "llama4",
                                               "num_local_experts": 4, "num_experts_per_tok": 1,
                                               "layer_types": ["sliding_attention"]
                                               * LLAMA["num_hidden_layers"]}),
                                   "layer_types: got 'sliding_attention'; entries allowed: "
                                   "chunked_attention"),
    "llama4-no-rope-word": (json.dumps({**LLAMA, "model_type": "llama4", "num_local_experts": 4,
                                        "num_experts_per_tok": 1, "attention_chunk_size": 64,
                                        "no_rope_layers": ["a"] * LLAMA["num_hidden_layers"]}),
                            "no_rope_layers: got 'a'"),
    "gpt2-positions-neg": (json.dumps({"model_type": "gpt2", "n_layer": 2, "n_embd": 128,
                                       "n_head": 4, "vocab_size": 1000, "n_positions": -1}),
                           "n_positions"),
    # a field a RoPE model does not read is still checked (a user trial's was taken silently)
    "llama-positions-neg": (_hf(max_position_embeddings=-1),
                            "max_position_embeddings: got -1; must be an integer >= 1"),
    # an absent key is its config class's default, said where it cannot be (4 heads, Mistral's 8)
    "mistral-kv-default": (json.dumps({"model_type": "mistral", "hidden_size": 256,
                                       "intermediate_size": 512, "num_hidden_layers": 2,
                                       "num_attention_heads": 4, "vocab_size": 1000}),
                           "num_key_value_heads: missing, read as its config class's "
                           "default 8 (transformers), which does not divide num_attention_heads "
                           "= 4; give it"),
}
for name, (content, needle) in HF_BAD.items():
    case(f"hf-config-{name}", ["evaluate", "--model", "{cfg}.json", *SCENARIO[2:], *PLAN],
         needle, **{"cfg.json": content})
case("hf-config-directory", ["evaluate", "--model", "{d}", *SCENARIO[2:], *PLAN],
     "folder without a config.json", d=DIR)
# a model path that is no file says what a model file may be (it had said "give a TOML file", and
# a folder whose config.json is a folder had been "without a config.json": a fifth fuzzing round's)
case("model-dev-null", ["evaluate", "--model", "/dev/null", *SCENARIO[2:], *PLAN],
     "model: got '/dev/null'; not a regular file; give a model TOML or HuggingFace config.json")
case("hf-config-json-a-directory", ["evaluate", "--model", "{d}", *SCENARIO[2:], *PLAN],
     "a folder whose config.json is not a file", **{"d": DIR, "d/config.json": DIR})
case("hf-config-fifo", ["evaluate", "--model", "{p}.json", *SCENARIO[2:], *PLAN],
     "not a regular file", **{"p.json": FIFO})
case("hf-config-missing-file", ["evaluate", "--model", "{d}/none.json", *SCENARIO[2:], *PLAN],
     "model", d=DIR)

# ---- cluster files ---------------------------------------------------------------------------
LEVELS = ('[[levels]]\nname = "node"\nsize = 8\nbandwidth_GBps = 450\nlatency_us = 3\n'
          '[[levels]]\nname = "net"\nbandwidth_GBps = 50\nlatency_us = 10\n')
CLUSTER = 'name = "mine"\naccelerator = "h100-sxm-80gb"\n' + LEVELS


def _cluster_with(old, new):
    assert old in CLUSTER, old
    return CLUSTER.replace(old, new, 1)


def _h100_with(keys: str) -> str:
    """CLUSTER with an inline accelerator: H100's with ``keys`` (TOML inline-table entries)."""
    return _cluster_with('accelerator = "h100-sxm-80gb"',
                         f'accelerator = {{ base = "h100-sxm-80gb", name = "a", {keys} }}')


CLUSTER_BAD = {
    # a file's cluster named as a catalog one it is not (outputs label it so: a fuzzing helper's)
    "catalog-name": (CLUSTER.replace('name = "mine"', 'name = "dgx-h100-ndr"'),
                     "cluster.name: got 'dgx-h100-ndr'; is a catalog cluster's name, and this "
                     "file's cluster differs from it"),
    # its accelerator likewise (an inline one, or a file's)
    "accelerator-catalog-name": (CLUSTER.replace(
        'accelerator = "h100-sxm-80gb"',
        'accelerator = { base = "h100-sxm-80gb", name = "h100-sxm-80gb", hbm_GiB = 40 }'),
        "accelerator.name: got 'h100-sxm-80gb'; is a catalog accelerator's name, and this "
        "file's accelerator differs from it"),
    # a GEMM table in FLOP, not GFLOP (every GEMM had run at a billionth of the peak)
    "efficiency-table-in-flop": (_h100_with(
        'matmul_efficiency_bf16_by_GFLOP = '
        '[[1e8, 0.03], [1e12, 0.72]]'), "the first point must be at most 100 GFLOP"),
    "not-toml": ("name = \n", "TOML"),
    "empty": ("", "accelerator"),
    "unknown-key": (CLUSTER + "colour = \"red\"\n", "colour"),
    # bits for bytes (a user trial's): the key it meant, and the figure in its unit
    "bandwidth-in-bits": (_cluster_with("bandwidth_GBps = 50", "bandwidth_Gbps = 400"),
                          "cluster.levels[net].bandwidth_Gbps: got 400; unknown key (did you mean "
                          "bandwidth_GBps? it takes gigabytes per second: 400 Gb/s is 50 GB/s)"),
    # hosts smaller than the innermost level (a GB200 NVL72 rack's trays) must tile it
    "host-not-dividing": (_cluster_with('accelerator = "h100-sxm-80gb"\n',
                                        'accelerator = "h100-sxm-80gb"\ndevices_per_host = 3\n'),
                          "devices_per_host: got 3; must divide the innermost level's size "
                          "(node: 8)"),
    "host-zero": (_cluster_with('accelerator = "h100-sxm-80gb"\n',
                                'accelerator = "h100-sxm-80gb"\ndevices_per_host = 0\n'),
                  "devices_per_host: got 0"),
    "host-word": (_cluster_with('accelerator = "h100-sxm-80gb"\n',
                                'accelerator = "h100-sxm-80gb"\ndevices_per_host = "4"\n'),
                  "devices_per_host: got '4'"),
    "no-accelerator": (CLUSTER.replace('accelerator = "h100-sxm-80gb"\n', ""), "accelerator"),
    "unknown-accelerator": (_cluster_with("h100-sxm-80gb", "h900"), "accelerator"),
    "accelerator-number": (_cluster_with('"h100-sxm-80gb"', "7"), "accelerator"),
    "no-levels": ('name = "x"\naccelerator = "h100-sxm-80gb"\n', "levels"),
    "level-size0": (_cluster_with("size = 8", "size = 0"), "size"),
    "level-size-neg": (_cluster_with("size = 8", "size = -8"), "size"),
    "level-size-float": (_cluster_with("size = 8", "size = 8.5"), "size"),
    "level-size-str": (_cluster_with("size = 8", 'size = "8"'), "size"),
    **{f"bandwidth{name}": (_cluster_with("bandwidth_GBps = 450", f"bandwidth_GBps = {value}"),
                            "bandwidth_GBps")
       for name, value in (("0", "0"), ("-neg", "-50"), ("-tiny", "1e-300"), ("-huge", "1e300"),
                           ("-nan", "nan"), ("-inf", "inf"))},
    "bandwidth-two-units": (_cluster_with("bandwidth_GBps = 450",
                                          "bandwidth_GBps = 450\nbandwidth_GiBps = 400"),
                            "bandwidth"),
    "bandwidth-missing": (_cluster_with("bandwidth_GBps = 450\n", ""), "bandwidth"),
    "latency-neg": (_cluster_with("latency_us = 3", "latency_us = -3"), "latency_us"),
    "latency-huge": (_cluster_with("latency_us = 3", "latency_us = 1e12"), "latency_us"),
    # unit slips a hardware trial's files had passed with (a latency of 0 or in seconds, HBM in
    # TB/s or TB, an fp8 peak below bf16's)
    "latency-zero": (_cluster_with("latency_us = 3", "latency_us = 0"),
                     "latency_us: got 0; must be in [0.01, 1e+06] (microseconds)"),
    "latency-in-seconds": (_cluster_with("latency_us = 3", "latency_us = 3e-6"),
                           "latency_us: got 3e-06"),
    "hbm-in-tb-per-s": (_h100_with('hbm_GBps = 3.35'),
        "hbm_GBps: got 3.35; must be in [50, 1e+06] (GB/s: TB/s times 1,000)"),
    "hbm-in-tb": (_h100_with('hbm_GiB = 0.141'),
        "hbm_GiB: got 0.141; must be in [1, 100000] (GiB: a TB is 931 GiB)"),
    # a peak in PFLOP/s (an academic's A100 at 0.312 had been costed 1,000 times slower)
    "peak-in-pflops": (_h100_with('peak_tflops_bf16 = 0.312, peak_tflops_fp8 = 0.624'),
        "peak_tflops_bf16: got 0.312; must be in [10, 100000] (dense TFLOP/s: PFLOP/s times "
        "1,000)"),
    # hosts that hold several innermost groups must tile a level's block (an academic's PCIe
    # servers of NVLink pairs)
    "host-tiling-no-block": (
        'name = "mine"\naccelerator = "h100-sxm-80gb"\ndevices_per_host = 6\n'
        '[[levels]]\nname = "node"\nsize = 2\nbandwidth_GBps = 450\nlatency_us = 3\n'
        '[[levels]]\nname = "pcie"\nsize = 4\nbandwidth_GBps = 25\nlatency_us = 5\n'
        '[[levels]]\nname = "net"\nbandwidth_GBps = 50\nlatency_us = 10\n',
        "devices_per_host: got 6; must divide the innermost level's size (node: 2), or be a "
        "multiple of one level's block of devices that divides the next level's (node: 2, pcie: "
        "8)"),
    "fp8-peak-below-bf16": (_h100_with('peak_tflops_fp8 = 500'),
        "peak_tflops_fp8: got 500; fp8's dense peak (500 TFLOP/s) is below bf16's (989.4): give "
        "both dense"),
    "efficiency-over-1": (_cluster_with("latency_us = 3", "latency_us = 3\nefficiency = 1.5"),
                          "efficiency"),
    "efficiency0": (_cluster_with("latency_us = 3", "latency_us = 3\nefficiency = 0"),
                    "efficiency"),
    "efficiency-tiny": (_cluster_with("latency_us = 3", "latency_us = 3\nefficiency = 1e-300"),
                        "efficiency: got 1e-300; must be in [0.001, 1]"),
    "memory-efficiency-tiny": (_h100_with('memory_efficiency = 1e-300'),
        "memory_efficiency"),
    "sustained-share-tiny": (_h100_with('sustained_share = 1e-300'),
        "sustained_share"),
    "compute-capability-word": (_h100_with('compute_capability = "sm90"'),
        "compute_capability: got 'sm90'"),
    "compute-capability-zero": (_h100_with('compute_capability = 0'),
        "compute_capability: got 0; must be in [1, 20] (NVIDIA's CUDA compute capability, e.g. "
        "9.0)"),
    "gflop-efficiency-tiny": (_h100_with(
        'matmul_efficiency_bf16_by_GFLOP = [[1, 1e-300]]'), "matmul_efficiency_bf16_by_GFLOP"),
    "oversubscription-below-1": (CLUSTER + "oversubscription = 0.5\n", "oversubscription"),
    # named as every other level key is (it had been "levels.name": a datacenter trial's)
    "duplicate-level-names": (_cluster_with('name = "net"', 'name = "node"'),
                              "cluster.levels[node].name: got 'node'; each level needs a name"),
    "levels-not-table": ('name = "x"\naccelerator = "h100-sxm-80gb"\nlevels = 3\n', "levels"),
    "level-unknown-key": (_cluster_with("latency_us = 3", "latency_us = 3\nspeed = 1"), "speed"),
    "utf16": ("\ufeffname = 1".encode("utf-16"), "UTF-8"),
    "inline-accelerator-bad": (CLUSTER.replace('accelerator = "h100-sxm-80gb"',
                                               'accelerator = { name = "a", hbm_GiB = -1 }'),
                               "accelerator"),
    # every missing key at once (a hardware trial's file had three, found one run at a time)
    "inline-accelerator-missing-keys": (CLUSTER.replace(
        'accelerator = "h100-sxm-80gb"',
        'accelerator = { name = "a", peak_tflops_bf16 = 900, hbm_GiB = 80, hbm_GBps = 3000, '
        'matmul_efficiency_bf16_by_GFLOP = [[1, 0.5]] }'),
        "accelerator.attention_efficiency: missing required key (so are "
        "memory_efficiency); valid keys: "),
    "level-size-huge": (_cluster_with("size = 8", "size = 100000000000000000"), "size"),
    "oversubscription-inf": (CLUSTER + "oversubscription = inf\n", "oversubscription"),
    # a ratio as a switch vendor writes it (a datacenter trial's): the number to write instead
    "oversubscription-ratio-text": (CLUSTER + 'oversubscription = "2:1"\n',
                                    "got '2:1'; must be a number; write the ratio as one number, 2"),
    # (the advice is the oversubscription's alone: a latency is no ratio)
    "latency-as-ratio-text": (_cluster_with("latency_us = 3\n", 'latency_us = "1:30"\n'),
                              "latency_us: got '1:30'; must be a number"),
    "level-name-blank": (_cluster_with('name = "net"', 'name = " "'), "name: got ' '"),
    "gflop-point-huge-integer": (CLUSTER.replace(
        'accelerator = "h100-sxm-80gb"',
        'accelerator = { base = "h100-sxm-80gb", name = "a", '
        'matmul_efficiency_bf16_by_GFLOP = [[1' + "0" * 400 + ', 0.5]] }'),
        "matmul_efficiency_bf16_by_GFLOP"),
    "bandwidth-huge-integer": (_cluster_with("bandwidth_GBps = 450",
                                             "bandwidth_GBps = 1" + "0" * 400), "bandwidth_GBps"),
    "fp8-peak-without-curve": (CLUSTER.replace(
        'accelerator = "h100-sxm-80gb"',
        'accelerator = { base = "a100-sxm-80gb", name = "a", peak_tflops_fp8 = 600 }'),
        "matmul_efficiency_fp8_by_GFLOP"),
    # a finite float whose FLOP overflow: named as given (it had been echoed as inf)
    "gflop-point-overflows": (_h100_with(
        'matmul_efficiency_bf16_by_GFLOP = [[1e300, 0.5]]'),
        "GFLOP 1e+300 is more FLOP than a float holds"),
    "gflop-point-inf": (_h100_with(
        'matmul_efficiency_bf16_by_GFLOP = [[inf, 0.5]]'), "matmul_efficiency_bf16_by_GFLOP"),
    "gflop-points-repeated": (_h100_with(
        'matmul_efficiency_bf16_by_GFLOP = [[1, 0.5], [1, 0.6]]'),
        "matmul_efficiency_bf16_by_GFLOP"),
    "memory-efficiency-zero": (_h100_with('memory_efficiency = 0'),
        "memory_efficiency"),
    "accelerator-base-number": (CLUSTER.replace(
        'accelerator = "h100-sxm-80gb"', 'accelerator = { base = 3, name = "a" }'), "base"),
    "kernel-overhead-huge": (_h100_with('kernel_overhead_us = 1e12'),
        "kernel_overhead_us"),
    "unmasked-gain-below-1": (_h100_with('unmasked_attention_gain = 0.9'),
        "accelerator.unmasked_attention_gain: got 0.9; must be a number in [1, 2]"),
    "unmasked-gain-word": (_h100_with('unmasked_attention_gain = "fast"'),
        "unmasked_attention_gain: got 'fast'"),
    "unmasked-gain-nan": (_h100_with('unmasked_attention_gain = nan'),
        "unmasked_attention_gain"),
    "fitted-on-word": (_h100_with('fitted_on = "my runs"'),
        "accelerator.fitted_on: got 'my runs'; must be a list of strings"),
}
for name, (content, needle) in CLUSTER_BAD.items():
    case(f"cluster-file-{name}", ["evaluate", "--model", "llama3-8b", "--cluster", "{c}.toml",
                                  "--gpus", "8", *PLAN], needle, **{"c.toml": content})
case("cluster-file-directory", ["evaluate", "--model", "llama3-8b", "--cluster", "{d}", "--gpus",
                                "8", *PLAN], "directory", d=DIR)
case("cluster-file-fifo", ["evaluate", "--model", "llama3-8b", "--cluster", "{f}.toml", "--gpus",
                           "8", *PLAN], "not a regular file", **{"f.toml": FIFO})
# a file named as a catalog accelerator it is not, listed (plan had refused it, list printed it:
# an academic user's trial)
case("accelerator-file-catalog-name", ["list", "accelerators", "{a}.toml"],
     "accelerator.name: got 'a100-sxm-80gb'; is a catalog accelerator's name",
     **{"a.toml": 'base = "a100-sxm-80gb"\nname = "a100-sxm-80gb"\nhbm_GiB = 40\n'})
case("accelerator-file-base-itself", ["list", "accelerators", "{a}.toml"], "cycle",
     **{"a.toml": 'base = "a.toml"\nname = "a"\n'})
case("accelerator-file-base-list", ["list", "accelerators", "{a}.toml"], "base",
     **{"a.toml": 'base = ["h100-sxm-80gb"]\n'})
# booleans are not numbers (a fuzzer's [true, true] had read as [1.0, 1.0])
case("accelerator-file-efficiency-booleans", ["list", "accelerators", "{a}.toml"],
     "attention_efficiency: got [True, True]",
     **{"a.toml": 'base = "h100-sxm-80gb"\nname = "a"\nattention_efficiency = [true, true]\n'})
case("accelerator-file-matmul-boolean", ["list", "accelerators", "{a}.toml"],
     "matmul_efficiency_bf16_by_GFLOP",
     **{"a.toml": 'base = "h100-sxm-80gb"\nname = "a"\n'
                  'matmul_efficiency_bf16_by_GFLOP = [[1, true]]\n'})
case("cluster-dev-zero", ["evaluate", "--model", "llama3-8b", "--cluster", "/dev/zero",
                          "--gpus", "8", *PLAN], "not a regular file")

# ---- stack files -------------------------------------------------------------------------------
STACK_BAD = {
    "unknown-key": ('base = "megatron-core"\nname = "s"\nturbo = true\n', "turbo"),
    # a misspelt key is named with the key meant (a user trial's)
    "misspelt-key": ('base = "megatron-core"\nname = "s"\nmatmul_scal = 0.9\n',
                     "stack.matmul_scal: got 0.9; unknown key (did you mean matmul_scale?)"),
    # a catalog name with a space after it had passed, printed as the catalog stack (a trial's)
    "name-catalogs-with-a-space": ('base = "megatron-core"\nname = "megatron-core "\n',
                                   "name: got 'megatron-core '; must not begin or end with white"),
    "overhead-huge-integer": ('base = "megatron-core"\nname = "s"\nstep_overhead_s = 1'
                              + "0" * 400 + "\n", "step_overhead_s"),
    "recompute-rule-superscript": ('base = "megatron-core"\nname = "s"\n'
                                   'recompute = { none = "none", x = "every:\u00b2" }\n',
                                   "recompute"),
    "wrong-type": ('base = "megatron-core"\nname = "s"\nfused_norm = "yes"\n', "fused_norm"),
    "recompute-every-beyond-any-model": ('base = "megatron-core"\nname = "s"\n'
                                         'recompute = { none = "none", x = "every:513" }\n',
                                         "every:N (2 <= N <= 512)"),
    "negative-scale": ('base = "megatron-core"\nname = "s"\nmatmul_scale = -1\n',
                       "matmul_scale"),
    "zero-scale": ('base = "megatron-core"\nname = "s"\nmemory_scale = 0\n', "memory_scale"),
    "nan-scale": ('base = "megatron-core"\nname = "s"\nattention_scale = nan\n',
                  "attention_scale"),
    "negative-overhead": ('base = "megatron-core"\nname = "s"\nstep_overhead_s = -0.1\n',
                          "step_overhead_s"),
    "inf-overhead": ('base = "megatron-core"\nname = "s"\nstep_overhead_s = inf\n',
                     "step_overhead_s"),
    **{f"{key}-huge": (f'base = "megatron-core"\nname = "s"\n{key} = {value}\n', key)
       for key, value in (("step_overhead_s", "1e308"), ("kernel_overhead_us", "1e12"),
                          ("allocator_overhead", "1e9"), ("moe_layer_host_ms", "1e12"),
                          ("reserved_GiB", "1e6"))},
    "injected-experts-with-expert-tp": ('base = "megatron-core"\nname = "s"\n'
                                        'expert_layer_injected = true\n',
                                        "expert_layer_injected: got true"),
    "overlap-over-1": ('base = "megatron-core"\nname = "s"\noverlap_efficiency = 2\n',
                       "overlap_efficiency"),
    # a multiplier of 1e-300 had printed a step of 1e302 s (and --json a traceback)
    "tiny-scale": ('base = "megatron-core"\nname = "s"\nmatmul_scale = 1e-300\n',
                   "matmul_scale: got 1e-300; must be a multiplier in [0.01, 10]"),
    "tiny-network-scale": ('base = "megatron-core"\nname = "s"\nnetwork_scale = [1e-300, 1]\n',
                           "network_scale"),
    "schedules-twice": ('base = "megatron-core"\nname = "s"\nschedules = ["1f1b", "1f1b"]\n',
                        "schedules must differ"),
    "schedules-empty": ('base = "megatron-core"\nname = "s"\nschedules = []\n',
                        "at least one pipeline schedule"),
    "zero-stages-twice": ('base = "megatron-core"\nname = "s"\nzero_stages = [1, 1]\n',
                          "stages must differ"),
    "axes-twice": ('base = "megatron-core"\nname = "s"\naxes = ["tp", "tp", "pp"]\n',
                   "axes must differ"),
    "base-unknown": ('base = "megatron-9"\nname = "s"\n', "megatron-9"),
    "base-number": ('base = 3\nname = "s"\n', "base"),
    "no-name-no-base": ('attention = "flash"\n', "stack.name: missing; a stack file "
                        "without base is a whole stack and names itself"),
    "bad-attention": ('base = "megatron-core"\nname = "s"\nattention = "sparse"\n',
                      "attention"),
    "bad-tp-overlap": ('base = "megatron-core"\nname = "s"\ntp_overlap = "async"\n',
                       "tp_overlap"),
    "bad-schedule": ('base = "megatron-core"\nname = "s"\nschedules = ["1f1b", "zb-h9"]\n',
                     "schedules"),
    "bad-zero-stage": ('base = "megatron-core"\nname = "s"\nzero_stages = [0, 5]\n',
                       "zero_stages"),
    "empty-zero-stages": ('base = "megatron-core"\nname = "s"\nzero_stages = []\n',
                          "zero_stages"),
    "default-zero-not-offered": ('base = "megatron-core"\nname = "s"\nzero_stages = [0, 1]\n'
                                 'default_zero = 3\n', "default_zero"),
    "bad-axis": ('base = "megatron-core"\nname = "s"\naxes = ["tp", "xp"]\n', "axes"),
    "recompute-without-none": ('base = "megatron-core"\nname = "s"\nrecompute = ["full"]\n',
                               "recompute"),
    "recompute-bad-rule": ('base = "megatron-core"\nname = "s"\n'
                           'recompute = { none = "none", half = "every:0" }\n', "half"),
    "recompute-unknown-module": ('base = "megatron-core"\nname = "s"\n'
                                'recompute = { none = "none", x = "modules:brain" }\n', "x"),
    # a module named twice had collapsed to once without a word
    "recompute-module-twice": ('base = "megatron-core"\nname = "s"\nrecompute = { none = "none", '
                               'x = "modules:mlp,core_attn,mlp" }\n',
                               "stack.recompute.x: got 'modules:mlp,core_attn,mlp'; module mlp "
                               "named twice; name each module once"),
    "recompute-unknown-name": ('base = "megatron-core"\nname = "s"\n'
                              'recompute = ["none", "most"]\n', "recompute"),
    "weight-bytes-3": ('base = "megatron-core"\nname = "s"\nweight_bytes = 3\n',
                       "weight_bytes"),
    "loss-saved-bytes-6": ('base = "megatron-core"\nname = "s"\nloss_saved_bytes = 6\n',
                           "loss_saved_bytes: got 6"),
    "grad-bytes-str": ('base = "megatron-core"\nname = "s"\ngrad_bytes = "4"\n', "grad_bytes"),
    "network-scale-one": ('base = "megatron-core"\nname = "s"\nnetwork_scale = [1.0]\n',
                          "network_scale"),
    "dispatcher-bad": ('base = "megatron-core"\nname = "s"\nmoe_dispatcher = "mail"\n',
                       "moe_dispatcher"),
    "reserved-neg": ('base = "megatron-core"\nname = "s"\nreserved_GiB = -1\n',
                     "reserved_GiB"),
    "moe-host-neg": ('base = "megatron-core"\nname = "s"\nmoe_layer_host_ms = -1\n',
                     "moe_layer_host_ms"),
    "attention-host-share-above-1": ('base = "megatron-core"\nname = "s"\n'
                                     'attention_host_share = 1.5\n', "attention_host_share: got 1.5"),
    "attention-host-share-word": ('base = "megatron-core"\nname = "s"\n'
                                  'attention_host_share = "half"\n', "attention_host_share"),
    "not-toml": ('base = "megatron-core\n', "TOML"),
    "export-format-bad": ('base = "megatron-core"\nname = "s"\nexport_format = "jax"\n',
                          "export_format"),
    "eager-op-unknown": ('base = "megatron-core"\nname = "s"\neager_ops = ["softmax"]\n',
                         "eager_ops"),
    "eager-op-twice": ('base = "megatron-core"\nname = "s"\n'
                       'eager_ops = ["glu_clamp", "glu_clamp"]\n', "eager_ops"),
    "eager-ops-str": ('base = "megatron-core"\nname = "s"\neager_ops = "scaled_rope"\n',
                      "eager_ops"),
    # torchtitan's eager clamp is counted beyond an unfused gated activation (a review's)
    "eager-clamp-compiled-torchtitan": ('base = "torchtitan-compile"\nname = "s"\n'
                                        'eager_ops = ["glu_clamp"]\n',
                                        "stack.eager_ops: got ['glu_clamp']; torchtitan runs its "
                                        "clamped GLU eagerly only where the gated MLP is unfused"),
    # a fuzzer's: a list item too big for a float had raised OverflowError; a policy name with a
    # line break split the text tables; invisible format characters showed as another name
    "network-scale-huge-int": ('base = "megatron-core"\nname = "s"\nnetwork_scale = [1, '
                               + "1" + "0" * 400 + "]\n",  # (a float holds up to ~1.8e308)
                               "network_scale: got 1000000000"),
    "recompute-name-line-break": ('base = "megatron-core"\nname = "s"\n'
                                  'recompute = {none = "none", "a\\nb" = "full"}\n',
                                  "a policy name is one word of printable characters"),
    "schedules-min-pp-micro-unknown": ('base = "torchtitan"\nname = "s"\n'
                                       'schedules_min_pp_micro = ["2f2b"]\n',
                                       "schedules_min_pp_micro"),
    "interleaved-rounds-unknown": ('base = "torchtitan"\nname = "s"\n'
                                   'interleaved_rounds = "flexible"\n',
                                   "stack.interleaved_rounds: got 'flexible'; allowed: pp, floor, any"),
    "tp-overlap-beyond-domain-full": ('base = "megatron-core"\nname = "s"\n'
                                      'tp_overlap_beyond_domain = "full"\n',
                                      "tp_overlap_beyond_domain: got 'full'; allowed: none, "
                                      "backward"),
    "name-zero-width-space": ('base = "megatron-core"\nname = "s\u200b"\n',
                              "no control or invisible format characters"),
    # a few-word key given another kind of value is told the words (a MoE trial's)
    "moe-overlap-bool": ('base = "nemo"\nname = "s"\nmoe_overlap = true\n',
                         "stack.moe_overlap: got true; must be one of none, shared, batch"),
    # what calibrate records of its runs (2026-12-06)
    "fitted-seq-len-reversed": ('base = "nemo"\nname = "s"\nfitted_seq_len = [8192, 4096]\n',
                                "stack.fitted_seq_len: got [8192, 4096]; must be [least, most]"),
    "fitted-seq-len-one": ('base = "nemo"\nname = "s"\nfitted_seq_len = [8192]\n',
                           "stack.fitted_seq_len: got [8192]; must be [least, most]"),
    "fitted-gpus-reversed": ('base = "nemo"\nname = "s"\nfitted_gpus = [64, 8]\n',
                             "stack.fitted_gpus: got [64, 8]; must be [least, most] devices"),
    "fitted-kinds-unknown": ('base = "nemo"\nname = "s"\nfitted_kinds = ["hybrid"]\n',
                             "stack.fitted_kinds: got 'hybrid'"),
    "fitted-accelerators-number": ('base = "nemo"\nname = "s"\nfitted_accelerators = [3]\n',
                                   "stack.fitted_accelerators: got [3]; must be a list of strings"),
}
for name, (content, needle) in STACK_BAD.items():
    case(f"stack-file-{name}", [*EVAL, "--stack", "{s}.toml"], needle, **{"s.toml": content})
case("stack-file-base-cycle", [*EVAL, "--stack", "{a}.toml"], "base",
     **{"a.toml": 'base = "{b}.toml"\nname = "a"\n', "b.toml": 'base = "{a}.toml"\nname = "b"\n'})
case("stack-file-self-base", [*EVAL, "--stack", "{a}.toml"], "base",
     **{"a.toml": 'base = "{a}.toml"\nname = "a"\n'})
case("stack-file-directory", [*EVAL, "--stack", "{d}"], "directory", d=DIR)
# a stack file may not take a catalog stack's name: outputs would call it that stack (a trial)
case("stack-file-named-like-the-catalog", [*EVAL, "--stack", "{s}.toml"],
     "stack.name: got 'torchtitan'; is a catalog stack's name",
     **{"s.toml": 'base = "nemo"\nname = "torchtitan"\n'})
case("stack-file-stem-like-the-catalog", [*EVAL, "--stack", "{nemo}.toml"],
     "stack.name: got 'nemo'; is a catalog stack's name; give the file's stack a name of its own "
     "(named for its file", **{"nemo.toml": 'base = "torchtitan"\n'})


# ---- plan files (evaluate --plan, export, report) ---------------------------------------------
def plan_with(path: str, value=None, *, drop: bool = False):
    """A plan-file variant: set (or drop) one key, ``path`` dotted from the file's top. A
    comparison row's MFU left at ``ROW``'s is made the one its step gives (the step's model FLOPs
    are the base plan's), so that a case fails on what it changes."""

    def make(base: dict) -> str:
        data = copy.deepcopy(base)
        keys = path.split(".")
        node = data
        for k in keys[:-1]:
            node = node[k]
        if drop:
            node.pop(keys[-1], None)
        else:
            node[keys[-1]] = copy.deepcopy(value)
        rows = data.get("comparison", {}).get("methods") if isinstance(
            data.get("comparison"), dict) else None
        flops = base["predicted"]["mfu"] * base["predicted"]["step_time_s"]
        for row in rows if isinstance(rows, list) else ():
            step = row.get("step_time_s") if isinstance(row, dict) else None
            if row.get("mfu") == ROW["mfu"] and type(step) is float and step > 0:
                row["mfu"] = flops / step
        return json.dumps(data, allow_nan=True)

    return make


ROW = {"method": "nest", "step_time_s": 1.0, "tokens_per_s": 16384.0, "mfu": 0.4, "peak_memory_gib": 30,
       "fits": True, "tp": 1, "pp": 1, "dp": 8, "zero": 1, "recompute": "none", "mbs": 1}
"""A comparison row as compare writes it (the keys every row has)."""
PLANFILE_BAD = {
    "tp-zero": (plan_with("plan.tp", 0), "tp"),
    "tp-str": (plan_with("plan.tp", "1"), "tp"),
    "dp-wrong": (plan_with("plan.dp", 3), "dp"),
    "zero-5": (plan_with("plan.zero", 5), "zero"),
    "recompute-unknown": (plan_with("plan.recompute", ["most"]), "recompute"),
    "recompute-number": (plan_with("plan.recompute", 3), "recompute"),
    "schedule-unknown": (plan_with("plan.schedule", "zb-h9"), "schedule"),
    "schedule-list": (plan_with("plan.schedule", ["1f1b"]), "plan.schedule"),
    "comparison-huge": (plan_with("comparison", {"methods": [{"method": "nest",
                                                               "tokens_per_s": 10**400}]}),
                        "comparison.methods[0].tokens_per_s"),
    "rank-order-bad": (plan_with("plan.rank_order", "tp-tp-dp-pp"), "rank_order"),
    # a list is echoed as it is written on the command line, not as a Python tuple
    "stage-layers-sum": (plan_with("plan.stage_layers", [31]), "stage_layers: got '31'"),
    "stage-layers-count": (plan_with("plan.stage_layers", [16, 16]), "stage_layers: got '16,16'"),
    "stage-layers-neg": (plan_with("plan.stage_layers", [40, -8]), "stage_layers"),
    "mbs-zero": (plan_with("plan.mbs", 0), "mbs"),
    "plan-missing": (plan_with("plan", drop=True), "plan"),
    "plan-not-object": (plan_with("plan", [1, 2]), "plan"),
    "model-missing": (plan_with("model", drop=True), "model"),
    "model-not-table": (plan_with("model", ["x"]), "must be a table"),
    "model-layers-neg": (plan_with("model.layers", -1), "layers"),
    "model-hidden-str": (plan_with("model.hidden", "big"), "hidden"),
    "model-mlp-bad": (plan_with("model.mlp", "kan"), "mlp"),
    "model-rope-mscale-neg": (plan_with("model.rope_mscale", -1.3), "rope_mscale"),
    "model-rope-mscale-str": (plan_with("model.rope_mscale", "yarn"), "rope_mscale"),
    "model-rope-theta-zero": (plan_with("model.rope_theta", 0), "model.rope_theta: got 0.0; must be "
                              "a number in [1, 1e+09]"),
    "model-rope-theta-str": (plan_with("model.rope_theta", "big"), "rope_theta"),
    "model-glu-clamp-ungated": (lambda base: plan_with("model.glu_clamp", 7.0)(
        json.loads(plan_with("model.mlp", "gelu")(base))), "glu_clamp"),
    "model-glu-clamp-inf": (plan_with("model.glu_clamp", 1e300), "glu_clamp"),
    "model-rope-mscale-alibi": (lambda base: plan_with("model.rope_mscale", 1.3)(
        json.loads(plan_with("model.position", "alibi")(base))), "rope_mscale"),
    "model-expert-bias-int": (plan_with("model.moe", {"experts": 8, "top_k": 2, "ffn_hidden": 64,
                                                      "expert_bias": 1}), "expert_bias"),
    "cluster-missing": (plan_with("cluster", drop=True), "cluster"),
    "cluster-bandwidth-neg": (lambda base: plan_with(
        "cluster.levels", [{**base["cluster"]["levels"][0], "bandwidth_GBps": -1},
                           *base["cluster"]["levels"][1:]])(base), "bandwidth_GBps"),
    "accelerator-hbm-neg": (plan_with("cluster.accelerator.hbm_GiB", -80), "hbm_GiB"),
    "accelerator-peak-nan": (plan_with("cluster.accelerator.peak_tflops_bf16", float("nan")),
                             "peak_tflops_bf16"),
    "gpus-zero": (plan_with("gpus", 0), "gpus"),
    "gpus-str": (plan_with("gpus", "8"), "gpus"),
    "training-seq-neg": (plan_with("training.seq_len", -2048), "seq_len"),
    "training-precision-bad": (plan_with("training.precision", "fp2"), "precision"),
    "stack-scale-neg": (plan_with("stack.matmul_scale", -1.0), "matmul_scale"),
    "stack-overhead-nan": (plan_with("stack.step_overhead_s", float("nan")), "step_overhead_s"),
    "stack-overhead-neg": (plan_with("stack.step_overhead_s", -5.0), "step_overhead_s"),
    "stack-overhead-inf": (plan_with("stack.step_overhead_s", float("inf")), "step_overhead_s"),
    "stack-unknown-key": (plan_with("stack.turbo", True), "turbo"),
    # a key deleted had been filled with the generic default, moving the step under the stack's
    # own name (a fifth fuzzing round's)
    "stack-key-missing": (lambda base: plan_with("stack.weight_bytes", drop=True)(
        json.loads(plan_with("stack.name", "mine")(base))),
        "stack.weight_bytes: missing; a plan file holds a stack of its own whole"),
    "stack-number": (plan_with("stack", 3), "stack: got 3; must be a table"),
    "headroom-bad": (plan_with("memory_headroom", 0.9), "memory_headroom"),
    # the flag's percent written into the file's share (a user trial's)
    "headroom-percent": (plan_with("memory_headroom", 6), "memory_headroom: got 6; must be a share "
                         "of HBM in [0, 0.5) (a fraction: 6 % is 0.06; --memory-headroom takes "
                         "percent)"),
    "predicted-word": (plan_with("predicted.step_time_s", "fast"), "predicted.step_time_s"),
    "predicted-negative": (plan_with("predicted.step_time_s", -5.0),
                           "predicted.step_time_s: got -5.0; must be a finite number >= 0"),
    "comparison-negative": (plan_with("comparison", {"methods": [{"method": "nest",
                                                                   "tokens_per_s": -1.0}]}),
                            "comparison.methods[0].tokens_per_s"),
    "comparison-tp-negative": (plan_with("comparison", {"methods": [
        {"method": "nest", "tokens_per_s": 5, "tp": -4}]}), "comparison.methods[0].tp"),
    "comparison-tp-fraction": (plan_with("comparison", {"methods": [
        {"method": "nest", "tokens_per_s": 5, "tp": 2.5}]}), "whole number"),
    # names a report shows: a fuzzer's 'not-a-method' and 'warp-drive' schedule were rendered
    "comparison-method-unknown": (plan_with("comparison", {"methods": [
        {"method": "not-a-method", "tokens_per_s": 5}]}),
        "comparison.methods[0].method: got 'not-a-method'; allowed: nest"),
    "comparison-schedule-unknown": (plan_with("comparison", {"methods": [
        {"method": "nest", "tokens_per_s": 5, "schedule": "warp-drive"}]}),
        "comparison.methods[0].schedule: got 'warp-drive'; allowed: gpipe, 1f1b"),
    "comparison-rank-order-unknown": (plan_with("comparison", {"methods": [
        {"method": "nest", "tokens_per_s": 5, "rank_order": "zz-yy"}]}),
        "comparison.methods[0].rank_order: got 'zz-yy'"),
    "comparison-etp-zero": (plan_with("comparison", {"methods": [
        {"method": "nest", "tokens_per_s": 5, "etp": 0}]}), "comparison.methods[0].etp: got 0"),
    "comparison-stage-layers-words": (plan_with("comparison", {"methods": [
        {"method": "nest", "tokens_per_s": 5, "stage_layers": ["x"]}]}),
        "comparison.methods[0].stage_layers: got ['x']"),
    "comparison-stage-layers-number": (plan_with("comparison", {"methods": [
        {"method": "nest", "tokens_per_s": 5, "stage_layers": 8}]}),
        "comparison.methods[0].stage_layers: got 8"),
    # a method's row of a full plan is a plan of this scenario (each had been shown as given)
    **{f"comparison-row-{key}-{value}": (plan_with("comparison", {"methods": [
        {**ROW, key: value}]}),
        needle) for key, value, needle in (
            ("zero", 9, "comparison.methods[0].zero: got 9; allowed: 0, 1, 2, 3"),
            ("recompute", "most", "comparison.methods[0].recompute: got 'most'; stack megatron-core "
                                  "offers"),
            ("recompute", "none*0", "comparison.methods[0].recompute: got 'none*0'"),
            ("tp", 3, "comparison.methods[0].dp: got 8; tp·pp·dp·cp = 3·1·8·1 = 24 must equal "
                      "gpus = 8"),
            ("pp", 10**9, "comparison.methods[0].pp: got 1000000000"))},
    "comparison-errors-unknown-method": (plan_with("comparison", {"methods": [
        ROW], "errors": {"wizard": "x"}}),
        "comparison.errors: got 'wizard'; allowed: nest"),
    "comparison-errors-not-a-message": (plan_with("comparison", {"methods": [
        ROW], "errors": {"nest": 5}}),
        "comparison.errors.nest: got 5; must be a message"),
    # a row without what compare writes of a method's plan, the same method twice, an MFU above
    # 1 (each had been shown as given, the MFU as inf %: a fifth fuzzing round's)
    "comparison-row-without-its-tp": (plan_with("comparison", {"methods": [
        {k: v for k, v in ROW.items() if k != "tp"}]}),
        "comparison.methods[0].tp: missing; a comparison row holds method"),
    "comparison-method-twice": (plan_with("comparison", {"methods": [ROW, ROW]}),
                                "comparison.methods[1].method: got 'nest'; given twice"),
    "comparison-mfu-beyond-the-peak": (plan_with("comparison", {"methods": [{**ROW, "mfu": 1e308}]}),
                                       "comparison.methods[0].mfu: got 1e+308; must be a share"),
    # figures that disagree with each other (a 1 ms step beside its tokens/s, a 10^6 GiB peak
    # that fits, had been shown in the report: a sixth fuzzing round's)
    "comparison-step-beside-other-tokens": (plan_with("comparison", {"methods": [
        {**ROW, "step_time_s": 0.5}]}), "comparison.methods[0].tokens_per_s: got 16384.0; must "
        "be the step's 16,384 tokens over its step_time_s 0.5"),
    "comparison-mfu-beside-its-step": (plan_with("comparison", {"methods": [
        ROW, {**ROW, "method": "manual", "mfu": 0.9}]}), "comparison.methods[1].mfu: got 0.9; must "
        "be the step's model FLOPs over its step_time_s 1 and the devices' peak, as nest's row "
        "gives them"),
    "comparison-error-blank": (plan_with("comparison", {"methods": [ROW], "errors": {"mcmc": ""}}),
                               "comparison.errors.mcmc: got ''; must be a message"),
    "comparison-huge-peak-fits": (plan_with("comparison", {"methods": [
        {**ROW, "peak_memory_gib": 1e6}]}), "comparison.methods[0].fits: got true; must say "
        "whether peak_memory_gib 1e+06 is within the 79.6 GiB of HBM"),
    # a key predicted never holds, and a null stack (each had been taken: the stack as the default)
    "predicted-unknown-key": (plan_with("predicted.xx", 1), "predicted.xx: got 1; unknown key"),
    "stack-null": (plan_with("stack", None), "stack: got null; must be a table"),
    "key-twice": ('{"format": 2, "format": 2}', "key 'format' is given twice"),
    "format-future": (plan_with("format", 99), "format"),
    "format-str": (plan_with("format", "2"), "format"),
    "method-magic": (plan_with("method", "magic"), "method"),
    "unknown-top-key": (plan_with("colour", "red"), "colour"),
    # a model's config.json given where a plan file goes (a user trial's): say which it is
    "hf-config": ('{"model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"]}',
                  "format: no such key: not a plan file but a HuggingFace model "
                  "config; give it to plan as --model"),
    "other-json": ('{"a": 1}', "no such key: not a plan file (no format, model or plan key)"),
    "not-json": ("{plan:", "JSON"),
    "array": ("[]", "JSON object"),
    "empty": ("", "JSON"),
    "binary": (b"\xff\xfe\x00", "UTF-8"),
}
for name, (content, needle) in PLANFILE_BAD.items():
    case(f"plan-file-{name}-evaluate", ["evaluate", "--plan", "{p}.json"], needle,
         **{"p.json": content})
# an output path that is the plan being read would replace it
case("report-onto-its-plan", ["report", "{p}.json", "-o", "{p}.json"], "is the plan file being read",
     **{"p.json": lambda base: json.dumps(base)})
# a device as the output of an export that writes files beside it (had written /dev/null.x)
case("export-extras-beside-a-device", ["export", "{p}.json", "--format", "deepspeed", "-o",
                                       "/dev/null"],
     "-o: got '/dev/null'; not a regular file, and the export also writes PATH.notes.txt",
     **{"p.json": lambda base: json.dumps(base)})
# /dev/stdout redirected to a file is one: the files beside it had been written into /dev (a fifth
# fuzzing round's)
case("export-extras-into-dev", ["export", "{p}.json", "--format", "deepspeed", "-o",
                                "/dev/nestplan-export.json"],
     "the export also writes PATH.notes.txt", **{"p.json": lambda base: json.dumps(base)})
# a stack without 1f1b and a pipeline without a schedule: the default it lacks is named (it had
# said "no interleaved pipeline schedule; use vp = 1" of vp 1: a sixth fuzzing round's)
case("evaluate-stack-without-1f1b", ["evaluate", *SCENARIO[:4], "--gpus", "16", "--stack",
                                     "{t}.toml", "--tp", "2", "--pp", "2", "--mbs", "1",
                                     "--global-batch", "64", "--seq-len", "4096"],
     "schedule: got '1f1b'; stack x runs gpipe; give the plan one of them",
     **{"t.toml": 'base = "megatron-core"\nname = "x"\nschedules = ["gpipe"]\n'})
# a middle model chunk without blocks, which torchtitan cannot name (its export had refused it
# after evaluate ran: a fuzzing helper's)
case("evaluate-torchtitan-empty-chunk", ["evaluate", *SCENARIO[:4], "--gpus", "16", "--stack",
                                         "torchtitan", "--tp", "1", "--pp", "2", "--vp", "2",
                                         "--mbs", "1", "--global-batch", "64", "--seq-len", "4096",
                                         "--recompute", "full", "--stage-layers", "16,0,8,8"],
     "stage-layers: got '16,0,8,8'; stack torchtitan names each model chunk by its blocks")
case("export-onto-its-plan", ["export", "{p}.json", "--format", "megatron", "-o", "{p}.json"],
     "is the plan file being read", **{"p.json": lambda base: json.dumps(base)})
for name in ("tp-zero", "recompute-unknown", "plan-missing", "not-json", "stack-overhead-nan",
             "format-future", "binary"):
    content, needle = PLANFILE_BAD[name]
    case(f"plan-file-{name}-export", ["export", "{p}.json", "--format", "megatron"], needle,
         **{"p.json": content})
    case(f"plan-file-{name}-report", ["report", "{p}.json", "-o", "{d}/r.html"], needle,
         **{"p.json": content, "d": DIR})
for where in ("evaluate", "export", "report"):
    args = {"evaluate": ["evaluate", "--plan", "{d}"],
            "export": ["export", "{d}", "--format", "megatron"],
            "report": ["report", "{d}", "-o", "{d}/r.html"]}[where]
    case(f"plan-file-directory-{where}", args, "directory", d=DIR)
    missing = [a.replace("{d}", "{d}/none.json") if a in ("{d}",) else a for a in args]
    case(f"plan-file-missing-{where}", missing, "none.json'; no such file", d=DIR)
case("export-unknown-format", ["export", "{p}.json", "--format", "jax"], "format",
     **{"p.json": plan_with("gpus", 8)})
case("export-into-missing-directory", ["export", "{p}.json", "--format", "megatron", "-o",
                                       "{d}/no/such/dir/run.sh"], "no/such/dir",
     **{"p.json": plan_with("gpus", 8), "d": DIR})
case("export-onto-a-directory", ["export", "{p}.json", "--format", "torchtitan", "-o", "{d}"],
     "directory", **{"p.json": plan_with("gpus", 8), "d": DIR})
case("export-output-twice", ["export", "{p}.json", "--format", "megatron", "-o", "{d}/a.sh",
                             "--output", "{d}/b.sh"], "-o and --output both given",
     **{"p.json": plan_with("gpus", 8), "d": DIR})
case("report-named-pdf", ["report", "{p}.json", "-o", "{d}/r.pdf"],
     "the report is HTML; name it .html, not .pdf", **{"p.json": plan_with("gpus", 8), "d": DIR})
case("report-onto-a-directory", ["report", "{p}.json", "-o", "{d}"], "directory",
     **{"p.json": plan_with("gpus", 8), "d": DIR})
case("evaluate-save-onto-a-directory", [*EVAL, "--save", "{d}"], "directory", d=DIR)
case("evaluate-save-into-missing-directory", [*EVAL, "--save", "{d}/no/such/p.json"],
     "no/such", d=DIR)
case("evaluate-plan-with-flags", ["evaluate", "--plan", "{p}.json", "--tp", "2"], "--plan",
     **{"p.json": plan_with("gpus", 8)})
# the flag as given (--no-sp had been named --sp)
case("evaluate-plan-with-no-sp", ["evaluate", "--plan", "{p}.json", "--no-sp"],
     "--plan takes the whole plan from the file; drop --no-sp", **{"p.json": plan_with("gpus", 8)})
# an empty output path names what it is for (it read as the working directory, or nothing)
case("evaluate-save-empty", [*EVAL, "--save", ""], "--save: got ''; must be a plan JSON")
# "-" is no file here (a pipeline engineer's trial got one named so); export's -o - prints
case("evaluate-save-dash", [*EVAL, "--save", "-"],
     "--save: got '-'; must be a plan JSON file path; standard output is not one here")
case("export-output-empty", ["export", "{p}.json", "--format", "megatron", "-o", ""],
     "-o: got ''", **{"p.json": plan_with("gpus", 8)})
case("report-output-empty", ["report", "{p}.json", "-o", ""], "-o: got ''",
     **{"p.json": plan_with("gpus", 8)})

# ---- runs CSVs (validate, calibrate) ---------------------------------------------------------
RUN_HEADER = ("id,model,layers,hidden,heads,kv_heads,ffn_hidden,vocab,seq_len,gpu,num_gpus,tp,pp,"
              "vp,dp,cp,zero_stage,sequence_parallel,recompute,micro_batch,global_batch,"
              "precision,regime,metric,step_time_s,confidence,source,other_metrics,stack")
RUN = ("r1,Llama-3-8B,32,4096,32,8,14336,128256,8192,H100-SXM5-80GB,8,1,1,,8,1,1,,none,1,8,"
       "bf16,pretrain,step_time,1.5,high,test,,megatron-core")


def _runs(old: str, new: str, *, header: str = RUN_HEADER) -> str:
    assert old in RUN, old
    return header + "\n" + RUN.replace(old, new, 1) + "\n"


RUNS_BAD = {
    "empty": ("", "runs"),
    "header-only": (RUN_HEADER + "\n", "run"),
    "missing-column": (RUN_HEADER.replace(",seq_len", "") + "\n" + RUN.replace(",8192", "", 1)
                       + "\n", "seq_len"),
    "bad-stack": (_runs(",megatron-core", ",megatron-9"), "stack"),
    "blank-id": (_runs("r1,", ","), "line 2: id: got ''; every row needs an id of its own"),
    # a misspelt key the prediction reads had been ignored, its memory row silently lost
    "other-metrics-misspelt": (_runs("test,,", "test,peak_mem_gib=60,"),
                               "got 'peak_mem_gib=60'; did you mean peak_memory_gib?"),
    "other-metrics-not-key-value": (_runs("test,,", "test,peak_memory_gib:60,"),
                                    "got 'peak_memory_gib:60'; entries are key=value"),
    # a plan this memory model puts at 6x HBM cannot be the plan that ran
    "plan-cannot-have-run": (_runs("r1,Llama-3-8B,32,4096,32,8,14336,128256,8192",
                                   "r1,Llama-3-70B,80,8192,64,8,28672,128256,8192"),
                             "row r1: plan: got 't1 p1 d8 z1 none b1'; needs"),
    # a per-device batch that disagrees with the row had been ignored without a word
    "local-batch-disagrees": (_runs("test,,", "test,local_batch=2,"),
                              "other_metrics: got 'local_batch=2'; global_batch 8 must be a whole "
                              "number of local batches over dp 8 (a multiple of 2·8 = 16)"),
    # a node size the row's cluster does not have had been ignored without a word
    "gpus-per-node-not-the-cluster's": (
        RUN_HEADER + ",gpus_per_node\n" + RUN + ",4\n",
        "gpus_per_node: got '4'; the row's cluster dgx-h100-ndr has 8 per node"),
    "layer-row-with-peak-memory": (RUN_HEADER + "\n" + RUN.replace(
        "H100-SXM5-80GB,8,1,1,,8,", "H100-SXM5-80GB,8,8,1,,1,").replace(
        ",step_time,1.5,high,test,,", ",layer_fwd_bwd_time,0.004,high,test,peak_memory_gib=30,")
        + "\n",
                                   "peak_memory_gib=30'; a layer_fwd_bwd_time row times one "
                                   "layer"),
    "attention-span-zero": (_runs("test,,", "test,attention_span=0,"),
                            "other_metrics: got 'attention_span=0'; attention_span must be a whole "
                            "number > 0"),
    "column-twice": ((RUN_HEADER + ",tp\n" + RUN + ",8\n"), "column: got 'tp'; given twice"),
    # dp blank: num_gpus over tp·pp·cp, which had been floored to 0 and refused as "dp: got 0"
    "degrees-not-dividing-gpus": (_runs("H100-SXM5-80GB,8,1,1,,8,1,", "H100-SXM5-80GB,8,3,1,,,1,"),
                                  "num_gpus: got 8; must be a multiple of tp·pp·cp = 3·1·1 = 3"),
    "fields-beyond-header": (_runs(",1.5,", ",1.5,").rstrip("\n") + ",extra\n",
                             "more fields than the header's"),
    "other-metrics-empty-value": (_runs("test,,", "test,peak_memory_gib=,"),
                                  "peak_memory_gib needs a value"),
    "one-id-twice": (_runs(",1.5,", ",1.5,") + RUN + "\n",
                     "line 3: id: got 'r1'; also the id of line 2"),
    "misspelt-column": (_runs("r1", "r1", header=RUN_HEADER.replace(",stack", ",stak")), "stak"),
    "stack-file-missing": (_runs(",megatron-core", ",nowhere.toml"), "stack"),
    "layers-word": (_runs(",32,", ",thirty,"), "layers"),
    "gpus-zero": (_runs(",H100-SXM5-80GB,8,", ",H100-SXM5-80GB,0,"), "num_gpus"),
    "step-negative": (_runs(",1.5,", ",-1.5,"), "step_time_s"),
    "step-nan": (_runs(",1.5,", ",nan,"), "step_time_s"),
    "step-word": (_runs(",1.5,", ",fast,"), "step_time_s"),
    "gpu-unknown": (_runs("H100-SXM5-80GB", "Z100"), "gpu"),
    "precision-bad": (_runs(",bf16,", ",fp2,"), "precision"),
    "recompute-bad": (_runs(",none,", ",some,"), "recompute"),
    "metric-bad": (_runs(",step_time,", ",vibes,"), "metric"),
    "plan-does-not-divide": (_runs(",8,1,1,,8,", ",8,3,1,,8,"), "tp"),
    "binary": (b"\xff\xfe\x00\x01", "UTF-8"),
    # numbers Python's float and int would read as something else, or absurd ones
    "step-underscore": (_runs(",1.5,", ",1_5,"), "step_time_s: got '1_5'"),
    "step-tiny": (_runs(",1.5,", ",1e-300,"), "step_time_s: got '1e-300'; must be a number of "
                  "seconds in [1e-06, 1e+07]"),
    "gpus-arabic-digits": (_runs(",H100-SXM5-80GB,8,", ",H100-SXM5-80GB,\u0668,"), "num_gpus"),
    "peak-tiny": (_runs("test,,", "test,peak_memory_gib=1e-300,"),
                  "peak_memory_gib must be a number of GiB, at least"),
    "gpu-against-cluster": (_runs("r1", "r1", header=RUN_HEADER + ",cluster").rstrip("\n")
                            + ",selene-a100-hdr\n", "its devices are a100-sxm-80gb"),
    "stage-layers-plus": (_runs("r1", "r1", header=RUN_HEADER + ",stage_layers").rstrip("\n")
                          + ",+16 1_6\n", "stage_layers: got '+16 1_6'"),
    "model-parallel-superscript": (_runs(",8,1,1,,8,", ",8,,1,,8,").replace(
        ",test,,", ",test,model_parallel_size=\u00b2,"), "model_parallel_size"),
    # the training checks had blamed other_metrics for every column they read
    "seq-len-huge": (_runs(",8192,", ",99999999999,"), "(r1).seq_len: got 99999999999"),
    "moe-imbalance-zero": (_runs("test,,", "test,moe_imbalance=0,"),
                           "other_metrics: got 'moe_imbalance=0'"),
    # a user's fuzzing: a misspelt regime ran as pretraining, a size column beside a named
    # model (layers blank) was ignored, gpus_per_node was never read
    "regime-misspelt": (_runs(",pretrain,", ",SFTT,"), "(r1).regime: got 'SFTT'; allowed: "
                        "pretrain, sft, lora"),
    "named-model-size-disagrees": (_runs("Llama-3-8B,32,4096,32,8,", "llama3-8b,,4096,32,16,"),
                                   "(r1).kv_heads: got 16; the model column names llama3-8b, "
                                   "whose kv_heads is 8"),
    "named-model-size-word": (_runs("Llama-3-8B,32,4096,", "llama3-8b,,nan,"),
                              "(r1).hidden: got 'nan'"),
    "gpus-per-node-negative": (_runs("r1", "r1", header=RUN_HEADER + ",gpus_per_node").rstrip(
        "\n") + ",-1\n", "(r1).gpus_per_node: got '-1'"),
    # neither batch column: the message names global_batch, the one a row normally gives
    "no-batch": (_runs(",none,1,8,", ",none,,,"), "(r1).global_batch: got ''; must be given"),
    # a fuzzer's, each once accepted and ignored: a key misspelt only in case, an expert column
    # without experts, an unknown gpu beside a cluster column, a model-parallel size the plan
    # contradicts, a node of 1e23 GPUs, a model without a name
    "other-metrics-case": (_runs("test,,", "test,Peak_Memory_GiB=60,"),
                           "got 'Peak_Memory_GiB=60'; did you mean peak_memory_gib?"),
    "expert-column-without-experts": (_runs("r1", "r1", header=RUN_HEADER + ",topk").rstrip(
        "\n") + ",2\n", "(r1).topk: got 2; describes experts, and the experts column is blank"),
    "expert-column-word": (_runs("r1", "r1", header=RUN_HEADER + ",moe_ffn_hidden").rstrip(
        "\n") + ",abc\n", "(r1).moe_ffn_hidden: got 'abc'"),
    "gpu-unknown-beside-cluster": (_runs("H100-SXM5-80GB", "Z100", header=RUN_HEADER + ",cluster")
                                   .rstrip("\n") + ",dgx-h100-ndr\n",
                                   "(r1).gpu: got 'Z100'; known (any case): "),
    # shown as written (it had been upper-cased), with the aliases read (they had been left out)
    "gpu-unknown-as-written": (_runs("H100-SXM5-80GB", "H100-PCIe"),
                               "(r1).gpu: got 'H100-PCIe'; known (any case): A100-SXM4-80GB"),
    "model-parallel-disagrees": (_runs("test,,", "test,model_parallel_size=8,"),
                                 "the model-parallel size is tp·pp = 1·1 = 1"),
    "gpus-per-node-huge": (_runs("r1", "r1", header=RUN_HEADER + ",gpus_per_node").rstrip(
        "\n") + ",99999999999999999999999\n", "gpus_per_node: got '99999999999999999999999'; "
                             "must be at most"),
    "model-blank": (_runs("r1,Llama-3-8B,", "r1,,"), "(r1).model: got ''; must be given"),
    # per-stage policies are read, one per pipeline stage (a fifth fuzzing round's: one was all)
    "recompute-stages-beyond-pp": (_runs(",none,1,8,", ",\"none,full\",1,8,"),
                                   "(r1): recompute: got 'none,full'; give one policy or one per "
                                   "pipeline stage (1; 2 given)"),
    # a row shorter than the header, without a column every row needs, had been refused as that
    # column blank (a short row's trailing optional columns read as blank)
    "row-short": (RUN_HEADER + "\n" + RUN.rsplit(",", 6)[0] + "\n",
                  "line 2: got '23 fields'; fewer than the header's 29 columns, without its "
                  "metric"),
    # a step time column in other units, met with "missing step_time_s" alone (a calibrating
    # user's): the close name is said, and that the column is in seconds
    "step-column-in-ms": (RUN_HEADER.replace("step_time_s", "step_time_ms") + "\n" + RUN + "\n",
                          "missing step_time_s (the file's step_time_ms is not one: the column "
                          "is step_time_s, in seconds)"),
    # a layer row on more GPUs than its tp had been refused for a dp derived from the count
    "layer-row-beyond-its-tp": (_runs(",step_time,", ",layer_fwd_bwd_time,"),
                                "(r1).num_gpus: got '8'; a layer_fwd_bwd_time row times one layer "
                                "on its tp GPUs (tp = 1): num_gpus must equal tp"),
}
for name, (content, needle) in RUNS_BAD.items():
    case(f"runs-csv-{name}-validate", ["validate", "--csv", "{r}.csv"], needle,
         **{"r.csv": content})
for name in ("empty", "step-negative", "step-nan", "gpu-unknown", "binary", "plan-cannot-have-run",
             "peak-tiny"):
    content, needle = RUNS_BAD[name]
    case(f"runs-csv-{name}-calibrate", ["calibrate", "{r}.csv", "-o", "{d}/mine.toml"], needle,
         **{"r.csv": content, "d": DIR})
# calibrate names its file as it takes it (RUNS.csv), not validate's --csv
case("calibrate-csv-not-utf8", ["calibrate", "{r}.csv", "-o", "{d}/mine.toml"],
     "RUNS.csv: got", **{"r.csv": b"\xff\xfe\x00\x01", "d": DIR})
case("validate-csv-directory", ["validate", "--csv", "{d}"], "directory", d=DIR)
# a header and no rows (had been told its LoRA rows were skipped: a pipeline engineer's), and a
# measured peak given as a column of its own
case("validate-csv-header-only", ["validate", "--csv", "{r}.csv"],
     "holds no run to check: it has a header and no rows",
     **{"r.csv": "id,model,seq_len,num_gpus,metric,step_time_s\n"})
case("validate-csv-peak-column", ["validate", "--csv", "{r}.csv"],
     "column: got 'peak_memory_gib'; unknown; peak_memory_gib goes in the other_metrics column",
     **{"r.csv": "id,model,seq_len,num_gpus,metric,step_time_s,peak_memory_gib\n"})
case("validate-csv-missing", ["validate", "--csv", "{d}/none.csv"], "none.csv", d=DIR)
case("validate-stack-unknown", ["validate", "--csv", "{r}.csv", "--stack", "megatron-9"],
     "stack", **{"r.csv": _runs(",1.5,", ",1.5,")})
# the file's name names the stack: one --stack would refuse is refused before the fit
case("calibrate-output-name-with-tab", ["calibrate", "{r}.csv", "-o", "{d}/x\ty.toml"],
     "-o: got", **{"r.csv": _runs(",1.5,", ",1.5,"), "d": DIR})
for name in (" a.toml", "b .toml", ".toml"):  # a stack named " a", or ".toml" (a helper's)
    case(f"calibrate-output-name-{name!r}", ["calibrate", "{r}.csv", "-o", "{d}/" + name],
         "names the fitted stack for the file (its name without .toml): give one with no space",
         **{"r.csv": _runs(",1.5,", ",1.5,"), "d": DIR})
case("calibrate-missing-output", ["calibrate", "{r}.csv"], "output",
     **{"r.csv": _runs(",1.5,", ",1.5,")})
case("calibrate-output-directory", ["calibrate", "{r}.csv", "-o", "{d}"], "directory",
     **{"r.csv": _runs(",1.5,", ",1.5,"), "d": DIR})
case("calibrate-output-empty", ["calibrate", "{r}.csv", "-o", ""], "-o: got ''",
     **{"r.csv": _runs(",1.5,", ",1.5,")})
case("calibrate-rows-of-two-stacks", ["calibrate", "{r}.csv", "-o", "{d}/m.toml"],
     "ran on several stacks (megatron-core, torchtitan)",
     **{"r.csv": _runs(",1.5,", ",1.5,") + RUN.replace("r1,", "r2,").replace(
         ",megatron-core", ",torchtitan") + "\n", "d": DIR})
# a stack column's typo is named by its row, as validate names it, not counted as a stack of
# its own (a user trial's: "the rows ran on several stacks (megatron-cor, megatron-core)")
case("calibrate-stack-column-typo", ["calibrate", "{r}.csv", "-o", "{d}/m.toml"],
     "(r2): stack: got 'megatron-cor'; unknown stack (did you mean 'megatron-core'?)",
     **{"r.csv": _runs(",1.5,", ",1.5,") + RUN.replace("r1,", "r2,").replace(
         ",megatron-core", ",megatron-cor") + "\n", "d": DIR})
# an output the system will not create is refused before the fit, not after it
case("calibrate-output-not-creatable", ["calibrate", "{r}.csv", "-o", "/proc/nestplan-mine.toml"],
     "-o: got '/proc/nestplan-mine.toml'; cannot write", **{"r.csv": _runs(",1.5,", ",1.5,")})
case("evaluate-save-not-creatable", [*EVAL, "--save", "/proc/nestplan-p.json"],
     "--save: got '/proc/nestplan-p.json'; cannot write")
case("calibrate-over-its-base", ["calibrate", "{r}.csv", "--stack", "{s}.toml", "-o", "{s}.toml"],
     "the base stack file", **{"r.csv": _runs(",1.5,", ",1.5,"),
                               "s.toml": 'base = "megatron-core"\nname = "s"\n'})
case("calibrate-over-its-runs", ["calibrate", "{r}.csv", "-o", "{r}.csv"],  # had overwritten it
     "is the runs CSV", **{"r.csv": _runs(",1.5,", ",1.5,")})
case("calibrate-step-time-far-from-any-calibration", ["calibrate", "{r}.csv", "-o", "{d}/m.toml"],
     "r.csv line 2 (r1).step_time_s: got '1e+06 s'; 10 or more times from what the base stack "
     "predicts", **{"r.csv": _runs(",1.5,", ",1e6,"), "d": DIR})
case("calibrate-peak-far-below-the-prediction", ["calibrate", "{r}.csv", "-o", "{d}/m.toml"],
     "r.csv line 2 (r1).peak_memory_gib: got '0.5 GiB'; 10 or more times from what the base "
     "stack predicts", **{"r.csv": _runs("test,,", "test,peak_memory_gib=0.5,"), "d": DIR})
case("runs-peak-memory-above-hbm", ["validate", "--csv", "{r}.csv"],
     "got 'peak_memory_gib=90'; more than the 79.6 GiB of HBM of h100-sxm-80gb",
     **{"r.csv": _runs("test,,", "test,peak_memory_gib=90,")})
case("calibrate-runs-key-twice", ["calibrate", "{r}.csv", "-o", "{d}/m.toml"],
     "peak_memory_gib given 2 times", **{"r.csv": _runs(
         "test,,", "test,peak_memory_gib=30;peak_memory_gib=abc,"), "d": DIR})
case("calibrate-unknown-base", ["calibrate", "{r}.csv", "--stack", "megatron-9", "-o",
                                "{d}/m.toml"], "stack", **{"r.csv": _runs(",1.5,", ",1.5,"),
                                                           "d": DIR})
case("calibrate-csv-missing", ["calibrate", "{d}/none.csv", "-o", "{d}/m.toml"],
     "RUNS.csv: got", d=DIR)  # the positional argument, not validate's --csv

# ---- sweep files ---------------------------------------------------------------------------
SWEEP = ('[grid]\nmodel = ["gpt-1p7b"]\ncluster = ["nest-h100-spineleaf"]\ngpus = [16]\n'
         'seq_len = [2048]\nglobal_batch = [64]\n')
SWEEP_BAD = {
    "not-toml": ("[grid\n", "TOML"),
    "empty": ("", "grid"),
    "no-grid": ('[constraints]\ntp_within_node = true\n', "grid"),
    "unknown-top-key": (SWEEP + "[extras]\nx = 1\n", "extras"),
    "unknown-grid-key": (SWEEP.replace("gpus = [16]", "gpus = [16]\ncolour = [\"red\"]"),
                         "colour"),
    "empty-list": (SWEEP.replace("gpus = [16]", "gpus = []"), "gpus"),
    "gpus-zero": (SWEEP.replace("gpus = [16]", "gpus = [0]"), "gpus"),
    "mtp-layers-negative": (SWEEP + "mtp_layers = [-1]\n", "grid.mtp_layers: got -1"),
    "headroom-boolean": (SWEEP + "memory_headroom_pct = [true]\n",
                         "grid.memory_headroom_pct: got true"),
    "headroom-fifty": (SWEEP + "memory_headroom_pct = [50]\n",
                       "grid.memory_headroom_pct: got 50; must be a percent of HBM in [0, 50)"),
    "schedule-unknown": (SWEEP + '[constraints]\nschedule = "zb-h9"\n', "schedule"),
    "gpus-str": (SWEEP.replace("gpus = [16]", 'gpus = ["16"]'), "gpus"),
    "gpus-huge-integer": (SWEEP.replace("gpus = [16]", "gpus = [1" + "0" * 400 + "]"),
                          "grid.gpus: got 1000"),
    "model-unknown": (SWEEP.replace('"gpt-1p7b"', '"gpt-9"'), "model"),
    "cluster-unknown": (SWEEP.replace('"nest-h100-spineleaf"', '"nowhere"'), "cluster"),
    "method-unknown": (SWEEP + 'method = ["genetic"]\n', "method"),
    # a duplicate that is one only as read shows the values as written, and as read
    "method-twice-in-two-cases": (SWEEP + 'method = ["nest", "NEST"]\n',
                                  "grid.method: got ['nest', 'NEST']; 'nest' appears twice as read "
                                  "(['nest', 'nest'])"),
    "seq-neg": (SWEEP.replace("seq_len = [2048]", "seq_len = [-1]"), "seq_len"),
    "network-level-unknown": (SWEEP + "[grid.network.moon]\noversubscription = [2]\n", "moon"),
    "network-value-bad": (SWEEP + "[grid.network.spine]\noversubscription = [0.1]\n",
                          "oversubscription"),
    "network-key-unknown": (SWEEP + "[grid.network.spine]\nwarp = [2]\n", "warp"),
    # named networks ([grid.networks]): each level of each name checked as the varied ones are
    "networks-not-tables": (SWEEP + "networks = [1, 2]\n", "grid.networks: got [1, 2]"),
    "networks-empty": (SWEEP + "[grid.networks]\n", "grid.networks: got {}"),
    "networks-name-blank": (SWEEP + '[grid.networks." "]\nspine = { latency_us = 5 }\n',
                            "a network's name must be printable"),
    "networks-no-levels": (SWEEP + "[grid.networks.fast]\n", "grid.networks.fast: got {}"),
    "networks-level-unknown": (SWEEP + "[grid.networks.fast]\nmoon = { latency_us = 5 }\n",
                               "grid.networks.fast: got 'moon'; not a level"),
    "networks-key-unknown": (SWEEP + "[grid.networks.fast]\nspine = { warp = 2 }\n", "warp"),
    "networks-list-value": (SWEEP + "[grid.networks.fast]\nspine = { latency_us = [5, 10] }\n",
                            "grid.networks.fast.spine.latency_us: got [5, 10]; must be one number"),
    "networks-value-bad": (SWEEP + "[grid.networks.fast]\nspine = { oversubscription = 0.1 }\n",
                           "grid.networks.fast.spine.oversubscription: got 0.1; must be a number"),
    "networks-value-str": (SWEEP + '[grid.networks.fast]\nspine = { latency_us = "5" }\n',
                           "grid.networks.fast.spine.latency_us: got '5'; must be a number"),
    "networks-two-bandwidths": (SWEEP + "[grid.networks.fast]\nspine = { bandwidth_GBps = 5, "
                                "bandwidth_GiBps = 5 }\n", "not both"),
    "networks-key-also-varied": (SWEEP + "[grid.networks.fast]\nspine = { bandwidth_GiBps = 100 }"
                                 "\n[grid.network.spine]\nbandwidth_GBps = [50, 100]\n",
                                 "grid.networks.fast.spine.bandwidth_GiBps: got 100; also varied "
                                 "in grid.network.spine.bandwidth_GBps; set it in one place"),
    "constraint-unknown": (SWEEP + "[constraints]\nturbo = true\n", "turbo"),
    "constraint-bad-value": (SWEEP + "[constraints]\ntp = 0\n", "tp"),
    # each value fine alone, but no point takes it: refused before any work (every point had
    # become an error row, and the sweep exited 0)
    "constraint-no-point-takes": (SWEEP.replace("gpus = [16]", "gpus = [16, 32]")
                                  + "[constraints]\ntp = 3\n",
                                  "constraints.tp: got 3; no point of the grid takes it (at the "
                                  "first: must divide gpus = 16 and heads = 24)"),
    # a grid value no point takes is named as the grid's (had been "constraints.precision")
    "grid-value-no-point-takes": (SWEEP.replace("nest-h100-spineleaf", "selene-a100-hdr")
                                  + 'precision = ["fp8"]\n',
                                  "grid.precision: got 'fp8'; no point of the grid takes it"),
    "attention-span-huge": (SWEEP + "attention_span = [100000000000]\n",
                            "grid.attention_span: got 100000000000; at most 16,777,216"),
    "stack-unknown": (SWEEP + 'stack = ["megatron-9"]\n', "stack"),
    # 500 x 300 = 150,000 points: over the limit, refused before listing them
    "too-many-points": (SWEEP.replace("gpus = [16]", f"gpus = {list(range(8, 4008, 8))}")
                        .replace("seq_len = [2048]", f"seq_len = {list(range(512, 154112, 512))}"),
                        "at most 100,000 points"),
}
for name, (content, needle) in SWEEP_BAD.items():
    case(f"sweep-file-{name}", ["sweep", "{s}.toml", "--dry-run"], needle, **{"s.toml": content})
# no point can be set up (every one asks for more GPUs than its cluster holds): refused before
# any work (every point had become an error row, and the sweep exited 0)
case("sweep-file-no-point-can-run", ["sweep", "{s}.toml", "--dry-run"],
     "grid: gpus: got 64; cluster small holds at most 32 (at every point of the grid",
     **{"s.toml": SWEEP.replace("gpus = [16]", "gpus = [64]").replace(
         '"nest-h100-spineleaf"', '"{c}.toml"'),
        "c.toml": 'name = "small"\naccelerator = "h100-sxm-80gb"\n[[levels]]\nname = "node"\n'
                  'size = 8\nbandwidth_GBps = 450\nlatency_us = 3\n[[levels]]\nname = "net"\n'
                  'size = 4\nbandwidth_GBps = 50\nlatency_us = 10\n'})
# model TOML files: a sub-table's key at the top level says where it belongs
MODEL_TOML = 'name = "x"\nlayers = 2\nhidden = 256\nheads = 4\nffn_hidden = 512\nvocab = 1000\n'
for name, (extra, needle) in {
        "moe-key-at-top": ("expert_bias = true\n", "belongs in the [moe] table"),
        "mla-key-at-top": ("kv_lora_rank = 64\n", "belongs in the [mla] table"),
        "rope-mscale-bool": ("rope_mscale = true\n", "rope_mscale"),
        "glu-clamp-str": ('mlp = "swiglu"\nglu_clamp = "7"\n', "glu_clamp"),
        # half of a local-attention setting had been ignored
        "local-share-without-span": ("local_share = 0.5\n", "model.local_span: got 0; local "
                                     "attention needs both"),
        "mla-with-grouped-kv": ("kv_heads = 2\n[mla]\nkv_lora_rank = 32\nq_lora_rank = 0\n"
                                "qk_nope_head_dim = 32\nqk_rope_head_dim = 32\nv_head_dim = 64\n",
                                "model.kv_heads: got 2; MLA keeps keys and values per head"),
        "mla-head-dim-off": ("head_dim = 7\n[mla]\nkv_lora_rank = 32\nq_lora_rank = 0\n"
                             "qk_nope_head_dim = 32\nqk_rope_head_dim = 32\nv_head_dim = 64\n",
                             "model.head_dim: got 7; with MLA"),
        # biases on q, k, v only are a model whose other layers have none
        "qkv-bias-with-bias": ("bias = true\nqkv_bias = true\n",
                               "model.qkv_bias: got true; bias (true unless set false) gives"),
        "qkv-bias-with-default-bias": ("qkv_bias = true\n", "set bias = false with it"),
        "qkv-bias-with-mla": ("bias = false\nqkv_bias = true\nhead_dim = 96\n[mla]\n"
                              "kv_lora_rank = 32\nq_lora_rank = 0\nqk_nope_head_dim = 64\n"
                              "qk_rope_head_dim = 32\nv_head_dim = 64\n",
                              "model.qkv_bias: got true; MLA's projections carry no"),
        "qkv-bias-word": ('bias = false\nqkv_bias = "yes"\n', "qkv_bias: got 'yes'"),
        # YaRN's table (kept for the exports)
        "yarn-key-at-top": ("beta_fast = 32\n", "belongs in the [yarn] table"),
        "scores-on-input-number": ("[moe]\nexperts = 4\ntop_k = 1\nffn_hidden = 64\n"
                                   "scores_on_input = 1\n", "scores_on_input: got 1"),
        "yarn-without-factor": ("[yarn]\nbeta_fast = 32.0\n", "factor"),
        "yarn-factor-below-one": ("[yarn]\nfactor = 0.5\n",
                                  "yarn.factor: got 0.5; must be a number in [1, 1e+06]"),
        "yarn-beta-zero": ("[yarn]\nfactor = 4.0\nbeta_slow = 0\n",
                           "yarn.beta_slow: got 0.0; must be a number in (0, 1e+06]"),
        "yarn-round-word": ('[yarn]\nfactor = 4.0\nround_to_int = "no"\n', "round_to_int: got 'no'"),
        "yarn-original-float": ("[yarn]\nfactor = 4.0\noriginal_max_positions = 4096.5\n",
                                "original_max_positions: got 4096.5"),
        "yarn-rope-mscale-disagrees": ("rope_mscale = 1.2\n[yarn]\nfactor = 32.0\n",
                                       "model.rope_mscale: got 1.2; must be 1.34657359, the "
                                       "cos/sin factor of the [yarn] table"),
        "yarn-unknown-key": ("[yarn]\nfactor = 4.0\nalpha = 1\n", "alpha"),
        "yarn-learned-positions": ('position = "learned"\nmax_positions = 4096\n[yarn]\n'
                                   "factor = 4.0\n", "model.yarn.factor: got 4.0; extends RoPE"),
        "attention-sinks-number": ("attention_sinks = 1\n", "attention_sinks: got 1"),
        "rope-scaling-kind-unknown": ('[rope_scaling]\nkind = "ntk"\nfactor = 4.0\n',
                                      "rope_scaling.kind: got 'ntk'; allowed: llama3, linear"),
        "rope-scaling-linear-nan": ('[rope_scaling]\nkind = "linear"\nfactor = 4.0\n'
                                    "high_freq_factor = nan\n", "rope_scaling.high_freq_factor: "
                                    "got nan"),
        "rope-scaling-with-yarn": ('[rope_scaling]\nkind = "linear"\nfactor = 4.0\n'
                                   "[yarn]\nfactor = 4.0\n", "model.rope_scaling.kind: got "
                                   "'linear'; scales RoPE's frequencies: needs position"),
        "rope-scaling-key-at-top": ("low_freq_factor = 1.0\n",
                                    "belongs in the [rope_scaling] table"),
        "max-positions-huge": ('position = "learned"\nmax_positions = 10000000000000000000\n',
                               "model.max_positions: got 10000000000000000000; at most"),
        "moe-without-moe-block": ("[moe]\nexperts = 4\ntop_k = 1\nffn_hidden = 64\n"
                                  "first_dense_layers = 2\n", "moe.first_dense_layers: got 2; "
                                  "must be below model.layers = 2"),
        "aux-loss-per-sequence-without-loss": ("[moe]\nexperts = 4\ntop_k = 1\nffn_hidden = 64\n"
                                               "aux_loss_per_sequence = true\n",
                                               "moe.aux_loss_per_sequence: got true"),
        "local-layers-not-the-share": ("local_span = 256\nlocal_share = 0.5\n"
                                       "local_layers = [0, 1]\n", "model.local_layers: got "
                                       "[0, 1]; must list the local layers"),
        "local-layers-words": ('local_span = 256\nlocal_share = 0.5\nlocal_layers = ["a"]\n',
                               "local_layers: got ['a']; must list layer indices, whole numbers"),
        "sliding-window-not-half-the-span": ("local_span = 256\nlocal_share = 1.0\n"
                                             "sliding_window = 64\n", "model.sliding_window: "
                                             "got 64; a sliding window costs as local_span"),
        "norm-eps-zero": ("norm_eps = 0\n", "model.norm_eps: got 0.0; must be a number in (0, "
                          "0.01]"),
        "norm-eps-word": ('norm_eps = "1e-6"\n', "norm_eps: got '1e-6'"),
        "rope-fraction-zero": ("rope_fraction = 0\n", "model.rope_fraction: got 0.0; must be "
                               "a number in (0, 1]"),
        "rope-fraction-learned": ('position = "learned"\nmax_positions = 4096\n'
                                  "rope_fraction = 0.5\n", "model.rope_fraction: got 0.5; "
                                  "applies only with position = \"rope\""),
        "shared-gate-without-shared": ("[moe]\nexperts = 4\ntop_k = 2\nffn_hidden = 128\n"
                                       "shared_expert_gate = true\n",
                                       "moe.shared_expert_gate: got true; gates the shared "
                                       "experts; moe.shared_experts is 0")}.items():
    case(f"model-file-{name}", ["evaluate", "--model", "{m}.toml", *SCENARIO[2:], *PLAN], needle,
         **{"m.toml": MODEL_TOML + extra})
# a width the heads do not divide, without head_dim (had floored head_dim, or read as 0: a
# third fuzzing round's)
for name, hidden in (("hidden-not-heads-multiple", 258), ("heads-wider-than-hidden", 2)):
    case(f"model-file-{name}", ["evaluate", "--model", "{m}.toml", *SCENARIO[2:], *PLAN],
         f"model.hidden: got {hidden}; must be a multiple of heads = 4 when the file gives no "
         "head_dim", **{"m.toml": MODEL_TOML.replace("hidden = 256", f"hidden = {hidden}")})
# a TOML date where a number belongs, shown as TOML writes it (it had shown
# datetime.date(1979, 5, 27): a fuzzing helper's)
case("model-file-layers-a-date", ["evaluate", "--model", "{m}.toml", *SCENARIO[2:], *PLAN],
     "model.layers: got 1979-05-27 (a TOML date or time); must be an integer",
     **{"m.toml": MODEL_TOML.replace("layers = 2", "layers = 1979-05-27")})
# a file's model named as a catalog one it is not (outputs label it so: a fuzzing helper's)
case("model-file-catalog-name", ["evaluate", "--model", "{m}.toml", *SCENARIO[2:], *PLAN],
     "model.name: got 'llama3-8b'; is a catalog model's name, and this file's model differs",
     **{"m.toml": MODEL_TOML.replace('name = "x"', 'name = "llama3-8b"')})
# a stack file the grid names, with a bad value inside: the message shows that value too
case("sweep-file-stack-file-bad-value", ["sweep", "{s}.toml", "--dry-run"],
     "stack.eager_ops: got 'glu-clamp'",
     **{"s.toml": SWEEP + 'stack = ["{t}.toml"]\n',
        "t.toml": 'base = "nemo"\nname = "t"\neager_ops = ["glu-clamp"]\n'})
case("sweep-file-missing", ["sweep", "{d}/none.toml"], "none.toml'; no such file", d=DIR)
case("sweep-file-directory", ["sweep", "{d}"], "directory", d=DIR)
case("sweep-workers-zero", ["sweep", "{s}.toml", "--workers", "0"], "workers",
     **{"s.toml": SWEEP})
case("sweep-workers-neg", ["sweep", "{s}.toml", "--workers", "-2"], "workers",
     **{"s.toml": SWEEP})
case("sweep-output-directory", ["sweep", "{s}.toml", "-o", "{d}"], ".csv",
     **{"s.toml": SWEEP, "d": DIR})
case("sweep-output-empty", ["sweep", "{s}.toml", "-o", ""], "output: got ''",
     **{"s.toml": SWEEP})


# ---- names and paths a file system cannot take ---------------------------------------------
# (a name too long to look up had been "cannot write the output", exit 1; a loop of links as an
# output path, and a name with a byte that is not UTF-8, a traceback)
LONG = "a" * 300
for flag in ("--model", "--cluster", "--stack"):
    args = [*EVAL, flag, LONG] if flag == "--stack" else [*_without(EVAL, flag), flag, LONG]
    case(f"evaluate{flag}-name-too-long", args, f"{flag[2:]}: got 'aaaa")
case("list-models-name-too-long", ["list", "models", LONG], "model: got 'aaaa")
case("evaluate-save-name-too-long", [*EVAL, "--save", LONG + ".json"], "cannot write (File name "
     "too long)")
case("evaluate-save-link-loop", [*EVAL, "--save", "{a}"], "--save: got '",
     a=Link("b"), b=Link("a"))
case("export-output-link-loop", ["export", "{p}.json", "--format", "megatron", "-o", "{a}"],
     "-o: got '", a=Link("b"), b=Link("a"), **{"p.json": lambda base: json.dumps(base)})
case("sweep-output-link-loop", ["sweep", "{s}.toml", "-o", "{a}.csv"], "output: got '",
     **{"s.toml": SWEEP, "a.csv": Link("b.csv"), "b.csv": Link("a.csv")})
# a loop of links as an input file (a traceback from Path.resolve)
for flag in ("--model", "--cluster", "--stack"):
    args = [*EVAL, flag, "{a}.toml"] if flag == "--stack" else [*_without(EVAL, flag), flag,
                                                                "{a}.toml"]
    case(f"evaluate{flag}-link-loop", args, f"{flag[2:]}: got '", **{
        "a.toml": Link("b.toml"), "b.toml": Link("a.toml")})
case("model-file-name-not-utf8", [*_without(EVAL, "--model"), "--model", "{bad\udcff}.json"],
     "must be UTF-8 text", **{"bad\udcff.json": _hf()})
case("plan-file-model-name-surrogate", ["evaluate", "--plan", "{p}.json"],
     "model.name: got 'x\\ud800y'; must be UTF-8 text",
     **{"p.json": plan_with("model.name", "x\ud800y")})
# a plan file holds its stack whole: a base there had been ignored without a word
case("plan-file-stack-base", ["evaluate", "--plan", "{p}.json"], "stack.base: got 'torchtitan'",
     **{"p.json": plan_with("stack.base", "torchtitan")})
# a star inside a repeated name, and a list flag echoed as typed (it had been a Python tuple)
for v in ("none**4", "none*4*1"):
    case(f"evaluate--recompute={v}", [*EVAL, "--recompute", v], "a policy repeated over stages")
case("evaluate--stage-layers-with-vp", [*_without(_without(EVAL, "--pp"), "--gpus"), "--gpus", "8",
                                        "--pp", "4", "--stage-layers", "8,8,8,8", "--vp", "2"],
     "stage-layers: got '8,8,8,8'; needs 8 entries")
# an empty path had been read as the working directory ("got '.'; a directory")
for args in (["validate", "--csv", ""], ["calibrate", "", "-o", "x.toml"], ["sweep", ""],
             ["export", "", "--format", "megatron"], ["evaluate", "--plan", ""]):
    case(f"{args[0]}-empty-input-path", args, "got ''; must be a")
# a sweep output below a file: "File exists" had been all it said
case("sweep-output-below-a-file", ["sweep", "{s}.toml", "-o", "{p}.json/x.csv"],
     "p.json is a file, not a directory", **{"s.toml": SWEEP, "p.json": "{}"})
# a HuggingFace config's own key, not nestplan's field
case("hf-first-k-dense-beyond-layers", [*_without(EVAL, "--model"), "--model", "{c}.json"],
     "first_k_dense_replace: got 100", **{"c.json": json.dumps({**DEEPSEEK,
                                                                "first_k_dense_replace": 100})})
# a period that leaves no MoE layer (it had made one of layer 3: the dense count as the offset)
case("hf-moe-layer-freq-beyond-layers", [*_without(EVAL, "--model"), "--model", "{c}.json"],
     "moe_layer_freq: got 100; leaves no MoE layer among the", **{"c.json": json.dumps(
         {**DEEPSEEK, "first_k_dense_replace": 1, "moe_layer_freq": 100})})
case("hf-nextn-layers-huge", [*_without(EVAL, "--model"), "--model", "{c}.json"],
     "num_nextn_predict_layers: got 100", **{"c.json": json.dumps({**DEEPSEEK,
                                                                   "num_nextn_predict_layers": 100})})
# a plan file's fits is true or false (it had been asked for a number); a split entry by index
case("plan-file-fits-word", ["evaluate", "--plan", "{p}.json"], "predicted.fits: got 'yes'; must "
     "be true or false", **{"p.json": plan_with("predicted.fits", "yes")})
case("plan-file-step-time-bool", ["evaluate", "--plan", "{p}.json"], "predicted.step_time_s: got "
     "true", **{"p.json": plan_with("predicted.step_time_s", True)})
case("plan-file-stage-layers-negative", ["evaluate", "--plan", "{p}.json"], "stage_layers[0]",
     **{"p.json": plan_with("plan.stage_layers", [-1])})
# a stage entry's numbers as the plan gives them, not floats or booleans that equal them; a
# format-1 file with a stack table; a format that is not a whole number
case("plan-file-stage-blocks-floats", ["evaluate", "--plan", "{p}.json"], "stages[0].blocks",
     **{"p.json": lambda base: plan_with("stages", [{**base["stages"][0], "blocks": [
         [float(a) for a in b] for b in base["stages"][0]["blocks"]]}])(base)})
case("plan-file-format-1-with-stack", ["evaluate", "--plan", "{p}.json"], "format: got 1; a plan "
     "file with a stack table", **{"p.json": plan_with("format", 1)})
case("plan-file-format-float", ["evaluate", "--plan", "{p}.json"], "format: got 2.0",
     **{"p.json": plan_with("format", 2.0)})
# a degree past any machine: its own limit (it had surfaced as another field's arithmetic)
for key, needle in (("vp", "vp: got 1000000000000000000000000000000; at most 512"),
                    ("mbs", "mbs: got 1000000000000000000000000000000; at most 16,777,216"),
                    ("pp", "pp: got 1000000000000000000000000000000; at most 1,048,576"),
                    ("etp", "etp: got 1000000000000000000000000000000; at most 1,048,576")):
    case(f"plan-file-{key}-huge", ["evaluate", "--plan", "{p}.json"], needle,
         **{"p.json": plan_with(f"plan.{key}", 10**30)})
# a quote never closed had swallowed the rest of the file into one row's id
case("runs-csv-quote-never-closed", ["validate", "--csv", "{r}.csv"],
     "a quoted field is never closed", **{"r.csv": RUN_HEADER + "\n\"" + RUN + "\n"})
# a sweep reads its results back and replaces them: a link to a device had been replaced
case("sweep-output-link-to-device", ["sweep", "{s}.toml", "-o", "{n}.csv"], "not a regular file",
     **{"s.toml": SWEEP, "n.csv": Link("/dev/null")})
# calibrate moves its file into place: over a device it would replace the device itself
case("calibrate-output-device", ["calibrate", "{r}.csv", "-o", "/dev/null"],
     "-o: got '/dev/null'; not a regular file", **{"r.csv": _runs(",1.5,", ",1.5,")})
case("calibrate-output-link-to-device", ["calibrate", "{r}.csv", "-o", "{n}.toml"],
     "not a regular file", **{"r.csv": _runs(",1.5,", ",1.5,"), "n.toml": Link("/dev/null")})
# an id with a terminal escape had been printed raw into the report's lines
case("runs-csv-id-escape", ["validate", "--csv", "{r}.csv"], "id: got 'r\\x1b[31m1'",
     **{"r.csv": RUN_HEADER + "\n" + RUN.replace("r1,", "\"r\x1b[31m1\",", 1) + "\n"})
# Megatron-Core splits no biased expert by expert TP (GPT-OSS's experts carry biases)
for cmd in ("evaluate", "plan"):
    case(f"{cmd}-biased-experts-etp", [cmd, "--model", "gpt-oss-120b", *SCENARIO[2:], "--tp", "2",
                                       "--ep", "4", "--etp", "2", *PLAN[2:]],
         "etp: got 2; stack megatron-core runs experts that carry biases at etp = 1 only")
# (without --ep too: it had fallen through to "no configuration fits in memory", exit 3)
case("plan-biased-experts-etp-without-ep", ["plan", "--model", "gpt-oss-120b", *SCENARIO[2:],
                                            "--etp", "2", *PLAN[4:]],
     "etp: got 2; stack megatron-core runs experts that carry biases at etp = 1 only")
case("plan-biased-experts-etp-torchtitan-ep-2", ["plan", "--model", "gpt-oss-120b",
                                                 *SCENARIO[2:], "--stack", "torchtitan",
                                                 "--etp", "2", "--ep", "2", *PLAN[4:]],
     "etp: got 2; stack torchtitan has no expert tensor parallelism of its own")
# a user stack with no expert TP of its own and none for biased experts: the plan follows TP
# (no degree to default to) and is refused by the bias rule, not by a search finding nothing;
# plan, whose flags fixed tp and ep, names tp and what would do
NO_EXPERT_TP = 'base = "megatron-core"\nexpert_tp_with_ep = false\nexpert_tp_with_bias = false\n'
for cmd, needle in (("evaluate", "etp: got 2; stack st runs experts that carry biases at etp = 1 "
                                 "only (expert_tp_with_bias = false"),
                    ("plan", "tp: got 2; stack st runs experts that carry biases at expert TP 1 "
                             "only, and without expert parallelism its experts follow tp; use "
                             "tp = 1 or ep > 1")):
    case(f"{cmd}-biased-experts-no-expert-tp-stack",
         [cmd, "--model", "gpt-oss-120b", *SCENARIO[2:], "--stack", "{st}.toml", "--tp", "2",
          "--ep", "1", "--sp", *PLAN[2:]], needle, **{"st.toml": NO_EXPERT_TP})
# evaluate --plan P --save P had replaced the plan it read, without a word (a user trial)
case("evaluate-save-over-the-plan-read", ["evaluate", "--plan", "{p}.json", "--save", "{p}.json"],
     "--save: got", **{"p.json": json.dumps})
# a near miss of a catalog name is named (a user trial): "did you mean"
case("model-name-near-miss", ["evaluate", "--model", "llama3-70", *SCENARIO[2:], *PLAN],
     "model: got 'llama3-70'; unknown model (did you mean 'llama3-70b'?); catalog names")
case("stack-name-near-miss", [*EVAL, "--stack", "torchtitn"],
     "unknown stack (did you mean 'torchtitan'?)")
case("cluster-name-near-miss", ["evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-nd",
                                "--gpus", "8", *PLAN], "unknown cluster (did you mean 'dgx-h100-ndr'?)")
# a flag before the subcommand is the top level's: its help, not the subcommand's
case("flag-before-subcommand", ["--turbo", *EVAL], "unrecognized arguments: --turbo (see nestplan --help)")
case("flag-after-subcommand", [*EVAL, "--turbo"],
     "unrecognized arguments: --turbo (see nestplan evaluate --help)")
case("calibrate-output-named-like-the-catalog", ["calibrate", "{r}.csv", "-o", "{d}/nemo.toml"],
     "names the fitted stack for the file, and 'nemo' is a catalog stack's name", d=DIR,
     **{"r.csv": RUN_HEADER + "\n" + RUN + "\n"})
case("model-file-qk-norm-word", ["evaluate", "--model", "{m}.toml", *SCENARIO[2:], *PLAN],
     "qk_norm: got 'yes'", **{"m.toml": MODEL_TOML + 'qk_norm = "yes"\n'})
case("model-file-qk-norms-of-both-kinds", ["evaluate", "--model", "{m}.toml", *SCENARIO[2:], *PLAN],
     "model.qk_l2_norm: got true; a model's QK norms are of one kind",
     **{"m.toml": MODEL_TOML + "qk_norm = true\nqk_l2_norm = true\n"})
case("model-file-qk-l2-norm-word", ["evaluate", "--model", "{m}.toml", *SCENARIO[2:], *PLAN],
     "qk_l2_norm: got 1", **{"m.toml": MODEL_TOML + "qk_l2_norm = 1\n"})
case("model-file-qk-norm-with-mla", ["evaluate", "--model", "{m}.toml", *SCENARIO[2:], *PLAN],
     "model.qk_norm: got true; MLA norms", **{"m.toml": MODEL_TOML + "qk_norm = true\n[mla]\n"
                                              "kv_lora_rank = 32\nq_lora_rank = 0\nqk_nope_head_dim "
                                              "= 32\nqk_rope_head_dim = 32\nv_head_dim = 64\n"})

# --save over a file the scenario is read from (a fifth fuzzing round's: a user's config.json,
# stack, cluster or accelerator file had been replaced by the plan, exit 0)
SCENARIO_FILE = ".toml'; is a file the scenario is read from (model, cluster, accelerator"
STACK_S = 'base = "megatron-core"\nname = "s"\n'
case("evaluate-save-over-its-model", ["evaluate", "--model", "{m}.toml", *SCENARIO[2:], *PLAN,
                                      "--save", "{m}.toml"], SCENARIO_FILE,
     **{"m.toml": MODEL_TOML})
case("plan-save-over-a-base-of-its-stack", [*SEARCH, "--stack", "{t}.toml", "--save", "{s}.toml"],
     SCENARIO_FILE,
     **{"s.toml": STACK_S, "t.toml": 'base = "s.toml"\nname = "t"\n'})
case("compare-save-over-its-clusters-accelerator",
     ["compare", "--model", "llama3-8b", "--cluster", "{c}.toml", "--gpus", "8", "--save",
      "{a}.toml"], SCENARIO_FILE,
     **{"a.toml": 'name = "acc-x"\nbase = "h100-sxm-80gb"\n',
        "c.toml": CLUSTER.replace('"h100-sxm-80gb"', '"a.toml"')})
