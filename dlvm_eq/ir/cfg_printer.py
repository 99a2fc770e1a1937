"""A module printed in DLVM's control-flow-graph spelling (`dlvm-eq fmt --cfg`): each `while`
becomes a loop header block whose `conditional` enters the body or leaves, each `cond` an
if/else diamond meeting at a join block with arguments; their bodies are written in place
(and are not printed as functions unless a scan, a switch or an apply also names them).
ir/cfg.py reads this text back into the same structured ops. `scan` and `switch` have no
CFG form in DLVM (no stacking, no multi-way branch): they stay ops, their bodies functions.

    'entry(%x: f32):
        branch 'loop.0(0: i32, %x: f32)
    'loop.0(%i: i32, %h: f32):
        %c = lessThan %i: i32, 10: i32
        conditional %c: bool then 'body.0() else 'exit.0()
    'body.0():
        ...
        branch 'loop.0(%j1: i32, %g1: f32)
    'exit.0():
        return %h: f32

Only what a result depends on is printed (the reader re-reads a loop header after the loop;
a value nothing reads would otherwise come back each time the text is read and printed).
"""

from __future__ import annotations

from .control_flow import COND, WHILE, bodies, elements
from .inline import live_instructions
from .module import Const, Function, Instruction, Module, Value
from .printer import format_adjoint, format_instruction, format_operand
from .types import TupleType

INLINED = (WHILE, COND)


def print_module_cfg(m: Module) -> str:
    """`m` as .dl text with its whiles and conds written as blocks and branches."""
    inlined: set[int] = set()  # written in place: functions only a while or cond runs
    named: set[int] = set()  # functions a scan, a switch or an apply names: printed
    for fn in m.functions.values():
        for inst in fn.body:
            if inst.op in INLINED:
                inlined.update(id(b) for b in bodies(inst.attrs))
            else:
                named.update(id(b) for b in bodies(inst.attrs))
                if inst.op == "apply":
                    named.add(id(m.functions.get(inst.attrs["callee"])))
    inlined -= named
    lines = [f'module "{m.name}"', f"stage {m.stage}"]
    for fn in m.functions.values():
        if id(fn) not in inlined:
            lines += ["", *_function(fn)]
    return "\n".join(lines) + "\n"


def _function(fn: Function) -> list[str]:
    sig = f"func @{fn.name}: ({', '.join(str(t) for t in fn.param_types)}) -> {fn.result_type}"
    head = [format_adjoint(fn.adjoint)] if fn.adjoint is not None else []
    if fn.is_declaration:
        return [*head, sig]
    w = _Writer({p.name for p in fn.params})
    env = {id(p): p for p in fn.params}
    w.open("'entry", list(fn.params))
    outs = w.body(fn, env)
    if len(outs) == 1:
        ret = outs[0]
    else:
        assert isinstance(fn.result_type, TupleType)  # several results: a tuple type
        ret = w.tuple_of(outs, fn.result_type)
    w.lines.append(f"    return {format_operand(ret)}")
    return [*head, sig + " {", *w.lines, "}"]


class _Writer:
    """Blocks being written for one function: every value printed under a name of its own."""

    def __init__(self, taken: set[str]):
        self.taken = set(taken)
        self.lines: list[str] = []
        self.labels = 0

    def name(self, base: str) -> str:
        name, k = base, 0
        while name in self.taken:
            k += 1
            name = f"{base}.{k}"
        self.taken.add(name)
        return name

    def label(self, kind: str) -> str:
        return f"'{kind}.{self.labels}"

    def open(self, label: str, params: list[Value]) -> None:
        args = ", ".join(f"%{p.name}: {p.type}" for p in params)
        self.lines.append(f"{label}({args}):")

    def emit(self, inst: Instruction, operands: list, result: Value | None = None) -> Value:
        result = result or Value(self.name(inst.result.name), inst.result.type)
        copy = Instruction(result, inst.op, operands, inst.attrs, inst.location)
        self.lines.append("    " + format_instruction(copy))
        return result

    def tuple_of(self, outs: list, t: TupleType) -> Value:
        return self.emit(Instruction(Value("tuple", t), "tuple", []), outs)

    def body(self, fn: Function, env: dict) -> list:
        """Write fn's live instructions (params already in env); its outputs, one per element."""
        get = lambda o: o if isinstance(o, Const) else env[id(o)]
        for inst in live_instructions(fn.body, [fn.ret]):
            ops = [get(o) for o in inst.operands]
            if inst.op == "extract" and isinstance(ops[0], tuple):  # of a loop written out
                env[id(inst.result)] = ops[0][inst.attrs["index"]]
                continue
            if inst.op == "tuple":  # the elements are passed on, not the tuple
                env[id(inst.result)] = tuple(ops)
                continue
            if inst.op == WHILE:
                outs = self.loop(inst, ops)
            elif inst.op == COND:
                outs = self.diamond(inst, ops)
            else:
                env[id(inst.result)] = self.emit(inst, ops)
                continue
            if isinstance(inst.result.type, TupleType):
                env[id(inst.result)] = tuple(outs)
            else:
                env[id(inst.result)] = outs[0]
        ret = fn.ret
        if isinstance(ret, Value) and isinstance(env[id(ret)], tuple):
            return list(env[id(ret)])
        if isinstance(fn.result_type, TupleType):
            whole = get(ret)
            assert isinstance(whole, Value)  # a tuple is a value, never a literal
            return self.extracts(whole, fn.result_type)
        return [get(ret)]

    def extracts(self, v: Value, t: TupleType) -> list:
        return [
            self.emit(Instruction(Value(f"{v.name}.{k}", e), "extract", [], {"index": k}), [v])
            for k, e in enumerate(t.elements)
        ]

    def loop(self, inst: Instruction, ops: list) -> list:
        a = inst.attrs
        test, step, nc = a["cond"], a["body"], a["carries"]
        n = self.labels
        self.labels += 1
        header, body, exit_ = f"'loop.{n}", f"'body.{n}", f"'exit.{n}"
        carries = [Value(self.name(p.name), p.type) for p in test.params[:nc]]
        self.lines.append(f"    branch {header}({', '.join(map(format_operand, ops[:nc]))})")
        self.open(header, carries)
        withs = ops[nc:]
        (c,) = self.body(test, _bind(test, carries + withs))
        if isinstance(c, Const):  # a conditional reads a value
            c = self.emit(Instruction(Value("c", c.type), "literal", [], _lit(c)), [])
        self.lines.append(f"    conditional {format_operand(c)} then {body}() else {exit_}()")
        self.lines.append(f"{body}():")
        new = self.body(step, _bind(step, carries + withs))
        self.lines.append(f"    branch {header}({', '.join(map(format_operand, new))})")
        self.lines.append(f"{exit_}():")
        return carries  # the reader reads the header's values as the loop's results

    def diamond(self, inst: Instruction, ops: list) -> list:
        yes, no = inst.attrs["branches"]
        n = self.labels
        self.labels += 1
        join = f"'join.{n}"
        results = [
            Value(self.name(f"join.{n}.{k}"), t) for k, t in enumerate(elements(yes.result_type))
        ]
        pred, args = ops[0], ops[1:]
        self.lines.append(
            f"    conditional {format_operand(pred)} then 'then.{n}() else 'else.{n}()"
        )
        for side, fn in (("then", yes), ("else", no)):
            self.lines.append(f"'{side}.{n}():")
            outs = self.body(fn, _bind(fn, args))
            self.lines.append(f"    branch {join}({', '.join(map(format_operand, outs))})")
        self.open(join, results)
        return results


def _bind(fn: Function, args: list) -> dict:
    return {id(p): a for p, a in zip(fn.params, args)}


def _lit(c: Const) -> dict:
    return {"value": c.value, "type": c.type}


__all__ = ["print_module_cfg"]
