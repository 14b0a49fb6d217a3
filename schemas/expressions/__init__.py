"""The one SQL expression engine: a parser, typing rules, and an evaluator per use.

* `syntax` -- the sqlglot parser (Spark dialect, bounded input), literals, conjuncts,
  which conjuncts may prune by partition, MERGE conditions;
* `types` -- value categories, text to typed values, literal coercion (Spark's implicit casts);
* `partitions` -- partition rows: the coordinator's append matching and the writer's pruning;
* `arrow` -- Arrow compute expressions: a writer's WHERE/SET/MERGE and a reader's filters;
* `stats` -- min/max data skipping;
* `scan` -- `files_read`: the files a DELETE, UPDATE or MERGE with a condition reads
  and declares (pruned by the coordinator's matcher, then skipped by stats).

The package itself imports nothing, so the coordinator's rules load the
partition matcher without Arrow.
"""
