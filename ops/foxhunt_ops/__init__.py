"""foxhunt_ops: staged rollout of plugins into foxhunt agents, under health gates.

Modules, in the order a rollout uses them:

* :mod:`.plan` — the rollout plan file (YAML, pydantic; ``file:line: path: message`` errors);
* :mod:`.stages` — a plan's stages resolved to the flag files that trials run;
* :mod:`.trial`, :mod:`.child`, :mod:`.backends` — one trial (one ``foxhunt train`` process
  that dies with its parent) and where it runs (local trial processes, one GPU each on CUDA, or
  Ray tasks);
* :mod:`.metrics`, :mod:`.stats`, :mod:`.gates` — what a trial measured, the statistics across
  seeds (scipy.stats), and the health gates' verdicts and a stage's analysis (Successful,
  Failed, Inconclusive);
* :mod:`.ledger`, :mod:`.state` — the SQLite (WAL) ledger, one row per trial and per decision,
  and where a rollout stands according to it;
* :mod:`.controller` — runs the stages (warm-started from the good stage where the plan says so),
  judges them, promotes, pauses or rolls back; the operator verbs;
* :mod:`.report`, :mod:`.plots` — the self-contained HTML report;
* :mod:`.cli` — ``foxhunt rollout ...``; :mod:`.errors` — the errors it reports.

The package lives in the repository's ``ops/`` folder (``ops/foxhunt_ops``) and is installed
with the ``foxhunt-core`` distribution; ``ops/plans`` holds the plans and ``ops/RUNBOOK.md`` the
operator's guide.
"""

__version__ = "0.1.0"
