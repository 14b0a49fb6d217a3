"""The storage edge: one table's files on a local disk or an object store (S3, Azure, GCS through obstore).

Reader, writer and coordinator all reach storage through `TableStorage` (`table.py`); it imports only `schemas`.
"""
