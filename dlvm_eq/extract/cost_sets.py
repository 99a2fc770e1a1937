"""Persistent cost sets for the greedy DAG extractor: {e-class: cost of the node used there}
maps that are never changed in place, so that a class's set is its child's set plus one entry
without copying the child's (greedy.py kept dict copies: quadratic in a chain's depth).

A set of at most SMALL classes is a plain dict (copying a few dozen entries is cheaper than any
tree), a larger one a treap: a binary search tree on the class index, heap-ordered on a fixed
hash of it, of tuples (class, cost, left, right, size, total). The shape of a treap depends only
on its classes, so two sets grown from one ancestor share every subtree off the paths where they
differ, and a union walks only those paths: adding a class, or merging two sets that share most
of their classes, takes O(differences * log n) steps. `total` is the sum of the costs below a
node, so a set's cost is read at its root. The recursion below follows root-to-leaf paths of a
treap, O(log n) deep whatever the program (the priorities are a fixed hash, so a chain of
classes does not unbalance it). None is the empty set.

    >>> s = added(added(None, 3, 1.0), 7, 2.0)
    >>> u = merged([s, added(None, 3, 5.0)])       # a later set's cost of a class wins
    >>> size(u), total(u), contains(u, 7), contains(u, 4)
    (2, 7.0, True, False)
"""

from __future__ import annotations

# a treap node: (class, cost, left, right, size, total); a small set is a dict
CostSet = dict | tuple | None
# Sets of up to this many classes stay dicts: below it a C-level dict copy beats a treap's
# Python-level path copy (measured on the extraction-gym graphs), above it the copy's length
# grows with the program and the treap's path does not.
SMALL = 256
FEW = 16  # a dict of fewer entries is inserted into a treap, not built into one and merged
KEY, COST, LEFT, RIGHT, SIZE, TOTAL = range(6)

_MASK = (1 << 64) - 1


def priority(key: int) -> int:
    """A fixed pseudo-random priority per class (splitmix64's finalizer), so that treap shapes
    do not depend on the order classes are added in."""
    z = (key + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return (z ^ (z >> 31)) << 32 | (key & 0xFFFFFFFF)  # ties broken by the key: unique


_PRIO: list[int] = []  # priority(k) for k < len(_PRIO), grown on demand


def _prio(key: int) -> int:
    if key >= len(_PRIO):
        _PRIO.extend(priority(k) for k in range(len(_PRIO), 2 * key + 64))
    return _PRIO[key]


def _node(key: int, cost: float, left: CostSet, right: CostSet) -> tuple:
    if left is None:
        if right is None:
            return (key, cost, None, None, 1, cost)
        return (key, cost, None, right, 1 + right[SIZE], cost + right[TOTAL])
    if right is None:
        return (key, cost, left, None, left[SIZE] + 1, left[TOTAL] + cost)
    return (key, cost, left, right, left[SIZE] + 1 + right[SIZE], left[TOTAL] + cost + right[TOTAL])


def _same(t: tuple, cost: float, left: CostSet, right: CostSet) -> tuple:
    """t itself when nothing changed (keeps subtrees shared), else a new node."""
    if left is t[LEFT] and right is t[RIGHT] and cost == t[COST]:
        return t
    return _node(t[KEY], cost, left, right)


def _tcontains(s, key: int) -> bool:
    while s is not None:
        k = s[KEY]
        if key == k:
            return True
        s = s[LEFT] if key < k else s[RIGHT]
    return False


def _titems(s) -> list[tuple[int, float]]:
    """(class, cost) pairs in class order (iterative: no recursion)."""
    out: list[tuple[int, float]] = []
    stack: list[tuple] = []
    while stack or s is not None:
        while s is not None:
            stack.append(s)
            s = s[LEFT]
        s = stack.pop()
        out.append((s[KEY], s[COST]))
        s = s[RIGHT]
    return out


def _split(s: CostSet, key: int) -> tuple[CostSet, CostSet]:
    """(classes below key, classes above key) of s, which does not hold key: callers split at
    a key of higher priority than s's root, which s would hold at its root if at all."""
    if s is None:
        return None, None
    if key < s[KEY]:
        lo, hi = _split(s[LEFT], key)
        return lo, _same(s, s[COST], hi, s[RIGHT])
    lo, hi = _split(s[RIGHT], key)
    return _same(s, s[COST], s[LEFT], lo), hi


def _tinsert(s: CostSet, key: int, cost: float) -> tuple:
    """s with key -> cost (replacing key's cost if s has it)."""
    p = _prio(key)
    if s is None or p > _prio(s[KEY]):
        lo, hi = _split(s, key)
        return _node(key, cost, lo, hi)
    k = s[KEY]
    if key < k:
        return _same(s, s[COST], _tinsert(s[LEFT], key, cost), s[RIGHT])
    if key > k:
        return _same(s, s[COST], s[LEFT], _tinsert(s[RIGHT], key, cost))
    return _same(s, cost, s[LEFT], s[RIGHT])


def _tunion(a: CostSet, b: CostSet) -> CostSet:
    """The classes of a and b; where both have a class, b's cost (as `dict(a) | dict(b)`)."""
    if a is b or b is None:
        return a
    if a is None:
        return b
    ka, kb = a[KEY], b[KEY]
    if ka == kb:  # same root (same shape above): only differing subtrees are walked
        lo, hi = _tunion(a[LEFT], b[LEFT]), _tunion(a[RIGHT], b[RIGHT])
        if lo is b[LEFT] and hi is b[RIGHT]:
            return b  # b holds a: keep b's nodes (a set merged with its own growth is that)
        return _same(a, b[COST], lo, hi)
    # different roots: the higher priority's key is not in the other set (it would be its root)
    if _prio(ka) > _prio(kb):
        lo, hi = _split(b, ka)
        return _same(a, a[COST], _tunion(a[LEFT], lo), _tunion(a[RIGHT], hi))
    lo, hi = _split(a, kb)
    return _same(b, b[COST], _tunion(lo, b[LEFT]), _tunion(hi, b[RIGHT]))


def _treap(s: CostSet):
    """s as a treap (a dict's entries inserted in its order)."""
    if type(s) is not dict:
        return s
    t = None
    for k, v in s.items():
        t = _tinsert(t, k, v)
    return t


# ------------------------------------------------------------------ the sets' interface


def size(s: CostSet) -> int:
    if s is None:
        return 0
    return len(s) if type(s) is dict else s[SIZE]


def total(s: CostSet) -> float:
    """The sum of the set's costs (a dict's in its order, as greedy summed them before)."""
    if s is None:
        return 0.0
    return sum(s.values()) if type(s) is dict else s[TOTAL]


def contains(s: CostSet, key: int) -> bool:
    if s is None:
        return False
    return key in s if type(s) is dict else _tcontains(s, key)


def items(s: CostSet) -> list[tuple[int, float]]:
    """(class, cost) pairs in class order."""
    if s is None:
        return []
    return sorted(s.items()) if type(s) is dict else _titems(s)


def added(s: CostSet, key: int, cost: float) -> CostSet:
    """s with key -> cost (a new set; s is left as it was)."""
    if s is None:
        return {key: cost}
    if type(s) is dict:
        if len(s) < SMALL:
            out = s.copy()
            out[key] = cost
            return out
        s = _treap(s)
    return _tinsert(s, key, cost)


def merged(sets) -> CostSet:
    """The union of `sets`; where several have a class, the last one's cost (as
    `d = dict(sets[0]); d.update(sets[1]); ...`)."""
    sets = [x for x in sets if x is not None]
    if not sets:
        return None
    if all(type(x) is dict for x in sets):
        out = dict(sets[0])
        for x in sets[1:]:
            out.update(x)
        return out if len(out) <= SMALL else _treap(out)
    acc = _treap(sets[0])
    for x in sets[1:]:
        if type(x) is dict and len(x) < FEW:
            for k, v in x.items():
                acc = _tinsert(acc, k, v)
        else:
            acc = _tunion(acc, _treap(x))
    return acc
