"""Asynchronous inference: requests accepted at once into a queue, answered by consumers, fetched later
(:mod:`~workbench.asynchronous.service`); the embedded queue and answer store is one SQLite file
(:mod:`~workbench.asynchronous.sqlite_queue`)."""
