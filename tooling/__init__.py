"""Development services: the local Kafka broker and cluster, the local storage servers, the Maven jars, the
bench and the demo, with one process supervisor (`processes.py`) and one chooser of listening ports (`ports.py`).
"""
