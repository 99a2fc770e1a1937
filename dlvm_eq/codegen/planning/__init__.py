"""IR function -> kernel plan: the plan's data (plan.py, views.py, plan_records.py for the plan
cache), the planner (planner.py, given the fusion stage's decision), row kernels
(rowfusion.py), GEMM epilogues (epilogue.py) and the order of steps and the arena
(steps_order.py).

May import: `dlvm_eq.ir`, `kernels`, `runtime` (the GEMM's host decisions: epilogue.py). Never
`dsl`, `egraph` or `ad`: the fusion decision and its report's class are passed in. Codegen's
layers, lowest first: kernels < llvm < cpu < gpu < runtime < planning < execution.
"""
