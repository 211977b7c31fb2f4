"""The parallel axes, one enum shared by specs, placement, search and exports."""

import enum


class Axis(str, enum.Enum):
    """A parallel axis. ``EP`` lives in the expert grid, which folds over the ``TP``×``CP``×``DP``
    ranks."""

    TP = "tp"
    CP = "cp"
    EP = "ep"
    DP = "dp"
    PP = "pp"


#: Axes that own a slot in the rank order (EP lives inside CP×DP).
RANK_AXES = (Axis.TP, Axis.CP, Axis.DP, Axis.PP)

#: Megatron-LM's default order, innermost first (its ``tp-cp-ep-dp-pp``).
MEGATRON_ORDER = (Axis.TP, Axis.CP, Axis.DP, Axis.PP)


def order_text(order) -> str:
    """A rank order as ``parse_order`` reads it (``"tp-cp-dp-pp"``, innermost first)."""
    return "-".join(a.value for a in order)


def parse_order(text: str) -> tuple[Axis, ...]:
    """Parse ``"tp-cp-dp-pp"`` (innermost first). ``ep`` may appear only just before ``dp``,
    where Megatron's order names it (``tp-cp-ep-dp-pp``): the expert grid folds over the tp, cp
    and dp ranks as Megatron-Core's expert rank generator lays it (``placement.expert_grid``),
    so EP has no place of its own to give."""
    from .errors import SpecError

    parts = [p for p in text.replace(",", "-").split("-") if p]
    for i, p in enumerate(parts):
        if p == "ep" and parts[i + 1:i + 2] != ["dp"]:
            raise SpecError("rank_order", text, "ep may appear only just before dp, as in "
                            "Megatron's 'tp-cp-ep-dp-pp': experts fold over the tp, cp and dp "
                            "ranks as Megatron-Core lays them; order tp, cp, dp and pp")
    names = [p for p in parts if p != "ep"]
    try:
        order = tuple(Axis(n) for n in names)
    except ValueError:
        raise SpecError("rank_order", text, "use a dash-separated permutation of tp, cp, dp, pp "
                        "(innermost first), e.g. 'tp-cp-dp-pp'") from None
    if sorted(a.value for a in order) != sorted(a.value for a in RANK_AXES):
        raise SpecError("rank_order", text, "must name each of tp, cp, dp, pp exactly once, "
                        "e.g. 'tp-cp-dp-pp' (ep, which folds over them, may stand just before "
                        "dp, as in Megatron's 'tp-cp-ep-dp-pp')")
    return order
