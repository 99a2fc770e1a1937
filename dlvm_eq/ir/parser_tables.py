"""The IR parser's LALR tables, kept in the compile cache as JSON data: building them costs
~60 ms a process, reading them back ~20 ms. Lark's own cache is a pickle (a file that runs
code when read); this one holds lark's serialized tables (`Lark.memo_serialize`), which lark
rebuilds only from its own parser classes.

    parser = lark_parser(grammar_text, parser="lalr", propagate_positions=True)
"""

from __future__ import annotations

import hashlib

from lark import Lark
from lark.grammar import Rule
from lark.lexer import TerminalDef

from ..cache import shared_cache
from ..json_records import RecordError, Schema

# plain values only: dicts keyed by state numbers, tuples of (action, target)
_TABLES = Schema("lark.tables", 1, [])


def lark_parser(grammar: str, **options) -> Lark:
    """Lark(grammar, **options), its tables read from the cache when a previous process built
    them for the same grammar, options and lark version."""
    import lark

    key = hashlib.sha256(
        "\0".join([grammar, repr(sorted(options.items())), lark.__version__]).encode()
    ).hexdigest()
    cache = shared_cache()
    data = cache.get("lark", key)
    if data is not None:
        try:
            doc = _TABLES.loads(data)
            return Lark._load_from_dict(doc["data"], doc["memo"])
        except Exception:
            cache.corrupt += 1
    parser = Lark(grammar, **options)
    try:
        tables, memo = parser.memo_serialize([TerminalDef, Rule])
        cache.put("lark", key, _TABLES.dumps({"data": tables, "memo": memo}).encode())
    except RecordError:
        pass
    return parser
