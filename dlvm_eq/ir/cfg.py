"""DLVM's control-flow graphs, blocks with arguments, turned into structured ops as they parse:

    'entry(%x: f32):
        branch 'loop(0: i32, %x: f32)
    'loop(%i: i32, %h: f32):                       // a loop header: one exit, one back edge
        %c = lessThan %i: i32, 10: i32
        conditional %c: bool then 'body(%i: i32, %h: f32) else 'done(%h: f32)
    'body(%j: i32, %g: f32):
        ...
        branch 'loop(%j1: i32, %g1: f32)
    'done(%r: f32):
        return %r: f32

becomes `while @f.loop.cond do @f.loop.body carry (0: i32, %x: f32)`, the header read again
after the loop (its values are visible past it), and an if/else diamond (`conditional` whose
sides meet again at the immediate post-dominator, or both return) becomes `cond` with one
branch function per side. Values a region reads from outside become trailing operands of
the op (closure conversion). What cannot be structured is a located error saying why: an
irreducible loop (entered other than through its header), a loop leaving other than at its
header's conditional, or one with several back edges.
"""

from __future__ import annotations

from lark import Token, Tree

from ..errors import IRError
from .control_flow import add_renamed, check, elements, joined
from .module import Function, Instruction, Value
from .types import BOOL, TensorType

EXIT = "<exit>"


def has_conditional(blocks: dict[str, Tree]) -> bool:
    return any(_term(b).data == "conditional" for b in blocks.values())


def _term(block: Tree) -> Tree:
    return block.children[-1]


def _succ(block: Tree) -> list[str]:
    t = _term(block)
    if t.data == "ret":
        return []
    if t.data == "branch":
        return [str(t.children[0])]
    return [str(c) for c in t.children if isinstance(c, Token) and c.type == "LABEL"]


class _Graph:
    def __init__(self, reader, blocks: dict[str, Tree], entry: str):
        self.reader, self.blocks, self.entry = reader, blocks, entry
        src = reader.src
        self.succ = {}
        for label, b in blocks.items():
            targets = _succ(b)
            for t in targets:
                if t not in blocks:
                    raise src.at(_term(b), f"no block {t} in @{reader.fn.name}")
            self.succ[label] = targets
        self.order = self._reachable()
        for label, b in blocks.items():
            if label not in self.order:
                raise src.at(b, f"block {label} is never branched to")
        self.dom = self._dominators(self.order, self._preds(), entry)
        # post-dominators: dominators of the reversed graph, from a virtual exit after returns
        post = {n: (self.succ[n] or [EXIT]) for n in self.order}
        post[EXIT] = []
        self.postdom = self._dominators([EXIT, *self.order], post, EXIT)
        self.loops = self._loops()

    def _reachable(self) -> list[str]:
        seen, order, todo = set(), [], [self.entry]
        while todo:
            n = todo.pop()
            if n in seen:
                continue
            seen.add(n)
            order.append(n)
            todo.extend(reversed(self.succ[n]))
        return order

    def _preds(self) -> dict[str, list[str]]:
        preds: dict[str, list[str]] = {n: [] for n in self.order}
        for n in self.order:
            for s in self.succ[n]:
                preds[s].append(n)
        return preds

    @staticmethod
    def _dominators(nodes, preds, root) -> dict[str, set[str]]:
        """Iterative dominator sets; `preds` gives each node's predecessors in the direction
        walked (for post-dominators: its successors)."""
        dom = {n: set(nodes) for n in nodes}
        dom[root] = {root}
        changed = True
        while changed:
            changed = False
            for n in nodes:
                if n == root:
                    continue
                ps = [dom[p] for p in preds.get(n, []) if p in dom]
                new = (set.intersection(*ps) if ps else set()) | {n}
                if new != dom[n]:
                    dom[n], changed = new, True
        return dom

    def _loops(self) -> dict[str, dict]:
        """header -> {"body": blocks of the natural loop, "latch": the back edge's source}."""
        src = self.reader.src
        loops: dict[str, dict] = {}
        # retreating edges of a depth-first walk must be back edges (reducible flow)
        state: dict[str, int] = {}
        stack = [(self.entry, iter(self.succ[self.entry]))]
        state[self.entry] = 1
        while stack:
            n, it = stack[-1]
            s = next(it, None)
            if s is None:
                state[n] = 2
                stack.pop()
                continue
            if state.get(s) == 1:  # a retreating edge n -> s
                if s not in self.dom[n]:
                    raise src.at(
                        _term(self.blocks[n]),
                        f"irreducible control flow: the loop through {s} is also entered "
                        f"other than through {s} (from {n}'s side), so it has no single "
                        "header and cannot become a structured loop",
                    )
                if s in loops:
                    raise src.at(
                        _term(self.blocks[n]),
                        f"loop {s} has several back edges ({loops[s]['latch']} and {n}); "
                        "branch back to it from one block",
                    )
                loops[s] = {"latch": n, "body": self._natural(s, n)}
            elif s not in state:
                state[s] = 1
                stack.append((s, iter(self.succ[s])))
        for h, loop in loops.items():
            t = _term(self.blocks[h])
            inside = [s for s in self.succ[h] if s in loop["body"]]
            if t.data != "conditional" or len(inside) != 1 or len(set(self.succ[h])) != 2:
                raise src.at(
                    t,
                    f"loop {h} must end its header with `conditional` into the loop on one "
                    "side and out of it on the other (a while loop)",
                )
            for n in loop["body"]:
                for s in self.succ[n]:
                    if s not in loop["body"] and n != h:
                        raise src.at(
                            _term(self.blocks[n]),
                            f"{n} leaves loop {h} to {s}; a loop may only be left at its "
                            "header's conditional",
                        )
        return loops

    def _natural(self, header: str, latch: str) -> set[str]:
        preds = self._preds()
        body, todo = {header, latch}, [latch]
        while todo:
            n = todo.pop()
            for p in preds[n]:
                if p not in body:
                    body.add(p)
                    todo.append(p)
        return body

    def ipostdom(self, n: str) -> str:
        strict = self.postdom[n] - {n}
        for c in strict:  # the one every other strict post-dominator post-dominates
            if all(o in self.postdom[c] for o in strict):
                return c
        return EXIT


# ---------------------------------------------------------------- reading regions


class _Captures(dict):
    """A sub-function's names: its own, else the enclosing reader's value, captured as a new
    trailing parameter of the sub-function (closure conversion)."""

    def __init__(self, parent_env, captured: list):
        super().__init__()
        self.parent_env, self.captured = parent_env, captured

    def get(self, name, default=None):
        if name in self:
            return self[name]
        outer = self.parent_env.get(name)
        if outer is None:
            return default
        param = Value(name, outer.type)
        self.captured.append((outer, param))
        self[name] = param
        return param


class _Sub:
    """A function being outlined: its reader, fixed parameters, captures."""

    def __init__(self, R, name: str, params: list[Value]):
        self.fn = Function(name, list(params), TensorType((), BOOL))
        self.captured: list[tuple[Value, Value]] = []
        self.reader = type(R)(R.src, R.module, self.fn)
        self.reader.env = _Captures(R.env, self.captured)
        self.reader.all_names, self.reader.def_names = R.all_names, R.def_names
        self.fixed = list(params)

    def finish(self, outs: list) -> None:
        self.fn.result_type = joined([o.type for o in outs])
        if len(outs) == 1:
            self.fn.ret = outs[0]
        else:
            t = self.fn.result_type
            tup = Instruction(Value(self.reader.fresh(), t), "tuple", list(outs))
            self.reader.body.append(tup)
            self.fn.ret = tup.result
        self.fn.body = self.reader.body


def _close(subs: list[_Sub]) -> list[Value]:
    """Give every sub-function the union of what they capture, in one order; the outer values."""
    union: dict[int, Value] = {}
    for s in subs:
        for outer, _ in s.captured:
            union.setdefault(id(outer), outer)
    for s in subs:
        own = {id(outer): p for outer, p in s.captured}
        extra = []
        for key, outer in union.items():
            extra.append(own.get(key) or Value(f"unused.{outer.name}", outer.type))
        s.fn.params = s.fixed + extra
    return list(union.values())


class Walker:
    """Reads a function's blocks into `reader`'s body, structuring the control flow."""

    def __init__(self, reader, blocks: dict[str, Tree], entry: str):
        self.reader, self.blocks = reader, blocks
        self.graph = _Graph(reader, blocks, entry)
        self.read_once: set[str] = set()
        self.counter = 0

    def run(self, entry: str) -> None:
        kind, value = self.walk(self.reader, entry, None, None, None)
        assert kind == "return"

    # -- blocks
    def bind(self, R, label: str, args, at) -> None:
        if args is None:
            return
        params = R.block_params(self.blocks[label])
        if [a.type for a in args] != [t for _, t in params]:
            got = ", ".join(str(a.type) for a in args)
            want = ", ".join(str(t) for _, t in params)
            raise R.src.at(at, f"{label} is entered with ({got}) but takes ({want})")
        for (tok, _), arg in zip(params, args):
            R.define(tok, arg)

    def instructions(self, R, label: str) -> None:
        block = self.blocks[label]
        *insts, term = block.children[1:]
        before = R.src.fast_used
        for inst in R.with_fast_lines(block, insts, term):
            if isinstance(inst, Tree) and inst.data == "inst":
                R.instruction(inst)
        if label in self.read_once:  # a header read again: its fast lines counted once
            R.src.fast_used = before
        self.read_once.add(label)

    def args(self, R, term: Tree, label_index: int) -> list:
        """The operands passed to the label at child `label_index` of a terminator."""
        nxt = term.children[label_index + 1] if label_index + 1 < len(term.children) else None
        if isinstance(nxt, Tree) and nxt.data == "operands":
            return R.operands(nxt)
        return []

    def walk(self, R, label: str, args, stop: str | None, header: str | None):
        """Read from block `label` (entered with `args`; None: already bound) until a branch
        to `stop` ("stop", args), back to loop `header` ("back", args), or a return."""
        at = self.blocks[label]
        while True:
            if label in self.graph.loops and label != header:
                label, args = self.loop(R, label, args, at)
                at = self.blocks[label]
                continue
            self.bind(R, label, args, at)
            self.instructions(R, label)
            term = _term(self.blocks[label])
            if term.data == "ret":
                if R is self.reader:
                    R.terminator(term, self.blocks, set())
                    return "return", R.fn.ret
                return "return", R.operand(term.children[0])
            if term.data == "branch":
                target, args = str(term.children[0]), self.args(R, term, 0)
                if target == header:
                    return "back", args
                if target == stop:
                    return "stop", args
                label, at = target, term.children[0]
                continue
            label, args, done = self.diamond(R, label, term, stop, header)
            if done is not None:
                return done
            at = term

    # -- structures
    def fresh(self, R, base: str) -> str:
        while True:
            name = f"{base}.{self.counter}"
            self.counter += 1
            if name not in R.all_names:
                return name

    def emit(self, R, op: str, operands, attrs, at) -> list[Value]:
        labels = [f"%{o.name}" if isinstance(o, Value) else f"constant {o.value}" for o in operands]
        try:
            rtype = check(op, [o.type for o in operands], attrs, labels)
        except IRError as e:
            raise R.src.at(at, str(e)) from None
        loc = R.src.location(at)
        result = Value(self.fresh(R, op), rtype)
        R.body.append(Instruction(result, op, list(operands), attrs, loc))
        outs = elements(rtype)
        if len(outs) == 1:
            return [result]
        values = []
        for i, t in enumerate(outs):
            v = Value(self.fresh(R, f"{result.name}.{i}"), t)
            R.body.append(Instruction(v, "extract", [result], {"index": i}, loc))
            values.append(v)
        return values

    def sub(self, R, suffix: str, params: list[Value]) -> _Sub:
        return _Sub(R, f"{self.reader.fn.name}.{suffix}", params)

    def side_names(self, R, label: str) -> list[str]:
        """Parameter names for a side's arguments: its block's (the join's, if it is one)."""
        return [str(tok)[1:] for tok, _ in R.block_params(self.blocks[label])]

    def header_params(self, R, label: str) -> list[Value]:
        return [Value(str(tok)[1:], t) for tok, t in R.block_params(self.blocks[label])]

    def loop(self, R, h: str, init, at):
        """`while` for the loop headed by h entered with `init`; (exit block, its args)."""
        term = _term(self.blocks[h])
        body = self.graph.loops[h]["body"]
        labels = [(i, str(c)) for i, c in enumerate(term.children) if isinstance(c, Token)]
        labels = [(i, lab) for i, lab in labels if lab in self.blocks]
        (i_in, inside), (i_out, outside) = sorted(labels, key=lambda p: p[1] not in body)
        name = h.lstrip("'")
        if init is None:
            raise R.src.at(at, f"loop {h} is the entry block; enter it with a branch")
        # the condition: the header's instructions, then its conditional (negated if the
        # loop continues on the else side)
        test = self.sub(R, f"{name}.cond", self.header_params(R, h))
        self.bind(test.reader, h, test.fixed, at)
        self.instructions(test.reader, h)
        c = test.reader.operand(term.children[0])
        if i_in > i_out:
            loc = R.src.location(term)
            neg = Value(test.reader.fresh(), c.type)
            test.reader.body.append(Instruction(neg, "not", [c], {}, loc))
            c = neg
        test.finish([c])
        # the body: the header again, then the loop's blocks back to the header
        step = self.sub(R, f"{name}.body", self.header_params(R, h))
        self.bind(step.reader, h, step.fixed, at)
        self.instructions(step.reader, h)
        if inside == h:  # the header is the whole loop
            kind, nxt = "back", self.args(step.reader, term, i_in)
        else:
            kind, nxt = self.walk(step.reader, inside, self.args(step.reader, term, i_in), None, h)
        if kind != "back":
            raise R.src.at(term, f"loop {h}'s body does not branch back to {h}")
        step.finish(nxt)
        withs = _close([test, step])
        for fn in (test.fn, step.fn):
            add_renamed(R.module, fn)
        attrs = {"cond": test.fn, "body": step.fn, "carries": len(init)}
        finals = self.emit(R, "while", [*init, *withs], attrs, term)
        # after the loop: the header's values at the final carries, then the exit
        self.bind(R, h, finals, at)
        self.instructions(R, h)
        return outside, self.args(R, term, i_out)

    def diamond(self, R, a: str, term: Tree, stop, header):
        """`cond` for the conditional ending block a; (join block, its args, None), or
        (None, None, ("return", value)) when both sides return."""
        j = self.graph.ipostdom(a)
        labels = [(i, str(c)) for i, c in enumerate(term.children) if isinstance(c, Token)]
        (i_t, t_label), (i_e, e_label) = [(i, lab) for i, lab in labels if lab in self.blocks]
        t_args, e_args = self.args(R, term, i_t), self.args(R, term, i_e)
        pred = R.operand(term.children[0])
        arg_types = [v.type for v in t_args + e_args]
        subs, outs_types = [], []
        names = self.side_names(R, t_label) + self.side_names(R, e_label)
        if len(set(names)) != len(names):  # both sides are the join
            names = [f"{n}.{i}" for i, n in enumerate(names)]
        for k, (side, n_before) in enumerate(((t_label, 0), (e_label, len(t_args)))):
            params = [Value(n, t) for n, t in zip(names, arg_types)]
            s = self.sub(R, f"{a.lstrip(chr(39))}.{'then' if k == 0 else 'else'}", params)
            mine = params[n_before : n_before + (len(t_args) if k == 0 else len(e_args))]
            if side == j:
                outs = mine
            else:
                kind, outs = self.walk(s.reader, side, mine, j, header)
                if kind == "back":
                    raise R.src.at(term, f"a side of this conditional branches back to {header}")
                if kind == "return":
                    outs = [outs]
            s.finish(outs)
            subs.append(s)
            outs_types.append(s.fn.result_type)
        withs = _close(subs)
        for s in subs:
            add_renamed(R.module, s.fn)
        attrs = {"branches": (subs[0].fn, subs[1].fn)}
        results = self.emit(R, "cond", [pred, *t_args, *e_args, *withs], attrs, term)
        if j == EXIT:
            if R is self.reader:
                value = results[0] if len(results) == 1 else None
                if value is None or value.type != R.fn.result_type:
                    raise R.src.at(term, "both sides return; their result must be one tensor")
                R.fn.ret = value
            return None, None, ("return", results[0])
        if j == stop:
            return None, None, ("stop", results)
        return j, results, None
