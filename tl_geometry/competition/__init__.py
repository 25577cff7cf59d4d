"""Competition and budgets: what happens to selection when keys compete (definitions §9).

Context scaling (the same targets predicted from longer contexts), a supporting fact under growing
background, and per-head key budgets compared at equal mean budget. Built on the intervention
layer's top-N restriction; see docs/competition.md.
"""
