"""Model runners: processes that hold each model version once and batch what every frontend process hands them.

``workbench serve --num_workers N`` on a machine with GPUs (or with ``--model_runners K``) splits the server: N
frontend processes answer the wire (HTTP and gRPC decoding, routing decisions, metrics), and K model runners (one per
GPU by default) load the models and run their batches, so batches form across every frontend and each device holds
one copy of a model. Tensors travel through shared memory (:mod:`~workbench.runners.arena`), control messages over a
Unix socket (:mod:`~workbench.runners.wire`). The runner's side is :mod:`~workbench.runners.runner`; the frontend's,
:mod:`~workbench.runners.link` (one connection) and :mod:`~workbench.runners.remote` (the servables it stands in for).
"""
