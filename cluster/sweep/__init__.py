"""Sweeps: any program over a table of parameters (docs/sweeps.md).

A sweep file (TOML) names a command pattern, a parameter table or axes, the inputs written
into each task's folder, the result files brought home, how a result is validated and what
is collected from all valid results.  This room holds the pure code every side needs: the
sweep file's grammar (:mod:`spec`), the table reader (:mod:`table`), the expansion of a
table row into a task (:mod:`expand`), the names that become files (:mod:`names`), the
validation and collection rules (:mod:`rules`,
:mod:`checks`, :mod:`collect`) and the rows of ``results.tsv`` (:mod:`joblog`).  It imports
nothing of the master or the node, so clusterpush (validating at submission), build.py
(making the task list), the node (running a task in its folder) and the end of a run
(validation, collection) can all use it.
"""
