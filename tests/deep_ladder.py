"""A generated deep program whose fusion problem grows faster than linearly: a chain of maps
with every step's row sum added into a running total, so every row-sum kernel may recompute the
chain below it (tests/test_fusion_budget.py)."""

T = "<4 x 8 x f32>"
R = "<4 x f32>"


def ladder_text(n: int) -> str:
    """n steps of v = tanh(v * 0.999 + y), s = sum of v along 1, total += s: 5n - 1 ops."""
    lines = [
        'module "ladder"',
        "stage raw",
        "",
        f"func @ladder: ({T}, {T}) -> {R} {{",
        f"'entry(%x: {T}, %y: {T}):",
    ]
    prev, total = "%x", None
    for i in range(n):
        lines += [
            f"    %m{i} = multiply {prev}: {T}, 0.999: f32",
            f"    %a{i} = add %m{i}: {T}, %y: {T}",
            f"    %v{i} = tanh %a{i}: {T}",
            f"    %s{i} = reduce %v{i}: {T} by add init 0: f32 along 1",
        ]
        if total is not None:
            lines.append(f"    %t{i} = add {total}: {R}, %s{i}: {R}")
        total = f"%t{i}" if total is not None else f"%s{i}"
        prev = f"%v{i}"
    return "\n".join(lines + [f"    return {total}: {R}", "}", ""])
