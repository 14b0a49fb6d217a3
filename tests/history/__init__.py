"""Jepsen/Elle-style history tests of deltacoord.

`workload` runs writer processes that record every transaction they propose
(what they read, what they wrote, what they were told) as JSON lines;
`checker` checks those histories against the committed order on the commits
topic; `chaos` runs the whole thing under coordinator and broker faults and is
the long-form command line (see its module docstring).
"""
