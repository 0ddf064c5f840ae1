"""TorchServe's gRPC protos (``inference.proto``, ``management.proto``) and their generated Python modules.

The ``.proto`` files declare TorchServe's interface (package ``org.pytorch.serve.grpc.inference`` / ``.management``), so
the wire format matches TorchServe's byte for byte. The ``*_pb2.py``, ``*_pb2.pyi`` and ``*_pb2_grpc.py`` modules
beside them are generated, not written; regenerate them from the repository root after changing a ``.proto``, with a
grpcio-tools whose protoc matches the protobuf runtime's major version (6.x) and no newer than the oldest grpcio
served (the ``_pb2_grpc`` modules refuse an older grpcio than the tools'), then put back the four header lines
(how the file was generated, ``# ruff: noqa``, ``# fmt: off``)::

    python -m venv /tmp/protoc && /tmp/protoc/bin/pip install "grpcio-tools==1.72.*"
    SITE=$(.venv/bin/python -c 'import google.rpc, pathlib; print(pathlib.Path(google.rpc.__path__[0]).parents[1])')
    /tmp/protoc/bin/python -m grpc_tools.protoc -I . -I "$SITE" --python_out=. --pyi_out=. --grpc_python_out=. \
        workbench/protocol/torchserve/inference.proto workbench/protocol/torchserve/management.proto

``google/rpc/status.proto`` (``PredictionResponse.status``) comes from googleapis-common-protos, whose
``google.rpc.status_pb2`` the generated inference module imports.
"""
