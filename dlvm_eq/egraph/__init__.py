"""The e-graph: loading IR into egglog, saturating rule files, serializing, unloading."""
from .serialized import Graph, class_types
from .session import EGraphSession, RuleFileError
from .terms import LoadedProgram, load_function
from .unload import unload

__all__ = ["EGraphSession", "Graph", "LoadedProgram", "RuleFileError", "class_types",
           "load_function", "unload"]
