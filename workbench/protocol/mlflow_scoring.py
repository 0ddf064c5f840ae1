"""MLflow's scoring protocol (``POST /invocations``, as ``mlflow models serve`` answers it) ↔ numpy.

A request is JSON holding exactly one of ``dataframe_split``, ``dataframe_records``, ``instances`` and ``inputs``,
with optional ``params``; or CSV (``text/csv``), or Parquet. It is read as MLflow reads it (a DataFrame for the
``dataframe_*`` forms, CSV and Parquet; columns or a tensor for ``instances`` and ``inputs``), then laid onto the
served signature's inputs: a column per input where the signature names its inputs, else the whole table or list as
its one input. ``params`` are the inputs the signature gives defaults (an MLflow model's params); others are ignored,
as MLflow ignores params its model does not declare.

An answer is ``{"predictions": ...}``: the one output as a list, several outputs of one value per row as records
(a DataFrame's ``to_dict(orient="records")``), else as an object of lists. Errors are MLflow's
``{"error_code": "BAD_REQUEST", "message": ...}`` with its HTTP statuses, and a refused content type its plain-text
415. pandas is imported by the first request that needs a DataFrame, never before.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from workbench.core.errors import Code, ServingError
from workbench.core.signatures import Signature, TensorSpec

JSON_TYPE = "application/json"
CSV_TYPE = "text/csv"
PARQUET_TYPE = "application/vnd.apache.parquet"
CONTENT_TYPES = (CSV_TYPE, JSON_TYPE, PARQUET_TYPE)
FORMATS = ("dataframe_split", "dataframe_records", "instances", "inputs")
PARAMS_KEY = "params"

# MLflow's error codes (mlflow.protos.databricks_pb2.ErrorCode names) for workbench's codes, and their HTTP statuses
# as mlflow.exceptions.ERROR_CODE_TO_HTTP_STATUS has them.
_ERROR_CODES: dict[Code, tuple[str, int]] = {
    Code.INVALID_ARGUMENT: ("BAD_REQUEST", 400),
    Code.FAILED_PRECONDITION: ("BAD_REQUEST", 400),
    Code.OUT_OF_RANGE: ("BAD_REQUEST", 400),
    Code.NOT_FOUND: ("RESOURCE_DOES_NOT_EXIST", 404),
    Code.ALREADY_EXISTS: ("RESOURCE_ALREADY_EXISTS", 400),
    Code.PERMISSION_DENIED: ("PERMISSION_DENIED", 403),
    Code.UNAUTHENTICATED: ("UNAUTHENTICATED", 401),
    Code.RESOURCE_EXHAUSTED: ("RESOURCE_EXHAUSTED", 429),
    Code.ABORTED: ("ABORTED", 409),
    Code.CANCELLED: ("CANCELLED", 499),
    Code.DEADLINE_EXCEEDED: ("DEADLINE_EXCEEDED", 504),
    Code.UNIMPLEMENTED: ("NOT_IMPLEMENTED", 501),
    Code.UNAVAILABLE: ("TEMPORARILY_UNAVAILABLE", 503),
    Code.DATA_LOSS: ("DATA_LOSS", 500),
}


class UnsupportedContent(Exception):
    """A request whose content type MLflow's scoring server refuses with a plain-text 415."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class MlflowError(ServingError):
    """A refusal MLflow answers with an error code of its own (``INVALID_PARAMETER_VALUE`` for data that does not
    fit the model's schema): an MLflow model's, or the codec's where it checks what MLflow would."""

    def __init__(self, code: Code, message: str, error_code: str) -> None:
        super().__init__(code, message)
        self.error_code = error_code


def error_body(error: ServingError) -> tuple[int, bytes]:
    """MLflow's error answer for ``error``: its HTTP status and ``{"error_code": ..., "message": ...}``."""
    name, status = _ERROR_CODES.get(error.code, ("INTERNAL_ERROR", 500))
    if isinstance(error, MlflowError):
        name = error.error_code
    return status, json.dumps({"error_code": name, "message": error.message}).encode()


def _bad(message: str) -> ServingError:
    """MLflow's MlflowInvalidInputException: its words start "Invalid input."."""
    return ServingError(Code.INVALID_ARGUMENT, f"Invalid input. {message}")


# --------------------------------------------------------------------------------------------- requests
@dataclasses.dataclass(frozen=True)
class ScoringRequest:
    """A request as MLflow reads it: a DataFrame (``frame``), columns (``columns``) or one tensor (``tensor``)."""

    frame: Any = None  # a pandas DataFrame
    columns: Mapping[str, Any] | None = None
    tensor: Any = None
    params: Mapping[str, Any] | None = None


def read_request(body: bytes, content_type: str | None) -> ScoringRequest:
    """``body`` as MLflow's scoring server reads it, by its content type."""
    parts = [p.strip() for p in (content_type or "").split(";")]
    mime = parts[0].lower()
    parameters = {key.strip().lower(): value.strip() for key, _, value in (p.partition("=") for p in parts[1:] if p)}
    if parameters.get("charset", "utf-8").lower() != "utf-8":
        raise UnsupportedContent("The scoring server only supports UTF-8")
    if unexpected := set(parameters) - {"charset"}:
        raise UnsupportedContent(f"Unrecognized content type parameters: {', '.join(sorted(unexpected))}.")
    if mime == JSON_TYPE:
        return read_json(body)
    if mime == CSV_TYPE:
        return ScoringRequest(frame=_read_table(body, "CSV", "to_csv"))
    if mime == PARQUET_TYPE:
        return ScoringRequest(frame=_read_table(body, "Parquet", "to_parquet"))
    raise UnsupportedContent(
        f"This predictor only supports the following content types: Types: {list(CONTENT_TYPES)}. "
        f"Got '{content_type or ''}'."
    )


def read_json(body: bytes | str | Mapping[str, Any]) -> ScoringRequest:
    """A JSON request: exactly one of :data:`FORMATS`, and ``params``."""
    if isinstance(body, Mapping):
        document: Any = body
    else:
        try:
            document = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise _bad(f"Ensure that input is a valid JSON formatted string. Error: '{exc!r}'") from None
    required = f"The input must be a JSON dictionary with exactly one of the input fields {set(FORMATS)}"
    if not isinstance(document, dict):
        kind = "a list" if isinstance(document, list) else f"unexpected input type '{type(document)}"
        raise _bad(f"{required}. Received {kind}.")
    present = [key for key in FORMATS if key in document]
    if len(present) != 1:
        raise ServingError(
            Code.INVALID_ARGUMENT, f"{required}. Received dictionary with input fields: {list(document)}."
        )
    (key,) = present
    params = document.get(PARAMS_KEY)
    if params is not None and not isinstance(params, dict):
        raise _bad(f"params must be a JSON object, not {type(params).__name__}")
    data = document[key]
    if key == "dataframe_split":
        return ScoringRequest(frame=_split_frame(data), params=params)
    if key == "dataframe_records":
        return ScoringRequest(frame=_records_frame(data), params=params)
    if key == "instances" and isinstance(data, list) and data and all(isinstance(row, dict) for row in data):
        columns: dict[str, list[Any]] = {}
        for row in data:
            for name, value in row.items():
                columns.setdefault(str(name), []).append(value)
        lengths = {len(values) for values in columns.values()}
        if len(lengths) > 1:
            raise _bad("The length of values for each input/column name are not the same")
        return ScoringRequest(columns=columns, params=params)
    if isinstance(data, dict):
        return ScoringRequest(columns={str(k): v for k, v in data.items()}, params=params)
    return ScoringRequest(tensor=data, params=params)


def _pandas() -> Any:
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - pandas comes with every platform that has DataFrames
        raise ServingError(
            Code.FAILED_PRECONDITION, "MLflow's dataframe_split, dataframe_records and CSV requests need pandas"
        ) from None
    return pd


def _split_frame(data: Any) -> Any:
    if not isinstance(data, dict):
        kind = "list" if isinstance(data, list) else f"type {type(data)}"
        raise _bad(f"Dataframe split format must be a dictionary. Got {kind}.")
    keys = set(data)
    if "data" not in keys or keys - {"columns", "data", "index"}:
        raise _bad(
            f"Dataframe split format must have 'data' field and optionally 'columns' and 'index' fields. Got {keys}.'"
        )
    try:
        return _pandas().DataFrame(index=data.get("index"), columns=data.get("columns"), data=data["data"])
    except Exception as exc:  # noqa: BLE001 - whatever pandas refuses is the client's
        raise _bad(
            f"Provided dataframe_split field is not a valid dataframe representation in 'split' format. Error: '{exc}'"
        ) from None


def _records_frame(data: Any) -> Any:
    if not isinstance(data, list):
        kind = "dictionary" if isinstance(data, dict) else f"type {type(data)}"
        raise _bad(f"Dataframe records format must be a list of records. Got {kind}.")
    try:
        return _pandas().DataFrame(data=data)
    except Exception as exc:  # noqa: BLE001
        raise _bad(
            f"Provided dataframe_records field is not a valid dataframe representation in 'records' format. "
            f"Error: '{exc}'"
        ) from None


def _read_table(body: bytes, kind: str, writer: str) -> Any:
    pd = _pandas()
    try:
        if kind == "CSV":
            return pd.read_csv(io.StringIO(body.decode("utf-8")))
        return pd.read_parquet(io.BytesIO(body))
    except Exception as exc:  # noqa: BLE001
        raise ServingError(
            Code.INVALID_ARGUMENT,
            f"Failed to parse input as a Pandas DataFrame. Ensure that the input is a valid {kind}-formatted Pandas "
            f"DataFrame produced using the `pandas.DataFrame.{writer}()` method. Error: '{exc}'",
        ) from None


# --------------------------------------------------------------------------------------------- onto a signature
def request_inputs(request: ScoringRequest, signature: Signature) -> dict[str, np.ndarray]:
    """The request's data as ``signature``'s inputs, each in the type it declares, and its params."""
    params = {alias for alias in signature.defaults}
    if request.frame is not None:
        frame = request.frame
        names = [str(c) for c in frame.columns]
        specs = _data_inputs(signature, names, params)
        if any(alias in names for alias in specs):
            inputs = _columns(_frame_columns(frame, names), specs, lambda values: values)
        elif len(specs) == 1:
            ((alias, spec),) = specs.items()
            inputs = {alias: _cast(alias, frame.to_numpy(), spec)}
        elif len(specs) == len(names):  # unnamed columns (a split frame without "columns"), in the signature's order
            inputs = {alias: _cast(alias, frame.iloc[:, i].to_numpy(), s) for i, (alias, s) in enumerate(specs.items())}
        else:
            raise _missing(list(specs), names)
    elif request.columns is not None:
        specs = _data_inputs(signature, list(request.columns), params)
        inputs = _columns(request.columns, specs, lambda values: values)
    else:
        specs = _data_inputs(signature, None, params)
        if len(specs) != 1:
            raise _bad(
                f"This model takes the inputs {', '.join(specs)}: send them by name (dataframe_split, "
                "dataframe_records, or an object of columns as inputs)"
            )
        ((alias, spec),) = specs.items()
        inputs = {alias: _cast(alias, request.tensor, spec)}
    for name, value in (request.params or {}).items():
        if name in params:
            inputs[name] = _cast(name, value, signature.inputs[name])
    return inputs


def _data_inputs(signature: Signature, sent: Sequence[str] | None, params: set[str]) -> dict[str, TensorSpec]:
    """The inputs a request's data fills: the signature's (or its features, named) without its params."""
    chosen = signature.request_inputs(sent) if sent is not None else signature.inputs
    return {alias: spec for alias, spec in chosen.items() if alias not in params}


def _columns(columns: Mapping[str, Any], specs: Mapping[str, TensorSpec], values: Any) -> dict[str, np.ndarray]:
    missing = [alias for alias in specs if alias not in columns]
    if missing:
        raise _missing(missing, list(columns))
    # Columns the model does not take are left out, as MLflow leaves them out of the DataFrame it enforces.
    return {alias: _cast(alias, values(columns[alias]), spec) for alias, spec in specs.items()}


def _frame_columns(frame: Any, names: Sequence[str]) -> dict[str, Any]:
    """The frame's columns by name, as numpy arrays. A frame of one numpy number type under distinct names (a
    ``dataframe_split`` of numbers) is read as one matrix, each column a view of it: the same values in the same
    type as each column's own ``to_numpy()``, without a pandas Series a column, which a wide frame (64 features)
    paid tens of µs each, a request."""
    dtypes = set(frame.dtypes)
    if len(dtypes) == 1 and len(set(names)) == len(names):
        (dtype,) = dtypes
        if isinstance(dtype, np.dtype) and dtype.kind in "biuf":
            matrix = frame.to_numpy()
            return {name: matrix[:, i] for i, name in enumerate(names)}
    return {name: frame[column].to_numpy() for name, column in zip(names, frame.columns, strict=True)}


def _missing(missing: Sequence[str], sent: Sequence[str]) -> ServingError:
    return MlflowError(
        Code.INVALID_ARGUMENT,
        f"Failed to enforce schema of data with the model signature. Error: Model is missing inputs {list(missing)}. "
        f"Sent: {list(sent)}",
        "INVALID_PARAMETER_VALUE",
    )


def _cast(alias: str, value: Any, spec: TensorSpec) -> np.ndarray:
    """``value`` in ``spec``'s type: numbers as numpy casts them, strings as UTF-8 bytes (workbench's strings)."""
    try:
        if spec.dtype.kind == "O":
            array = np.asarray(value, dtype=object)
            flat = array.reshape(-1)
            for i, item in enumerate(flat):
                if isinstance(item, str):
                    flat[i] = item.encode("utf-8")
            return array
        array = np.asarray(value)
        if array.dtype.kind in "OSU" and spec.dtype.kind in "biufc":
            # MLflow casts a column with astype: "1.5" becomes 1.5, "x" fails the request.
            array = array.astype(np.float64) if spec.dtype.kind in "fc" else array.astype(spec.dtype)
        fractions = spec.dtype.kind in "iu" and array.dtype.kind == "f"  # checked only where they matter
        if fractions and not (np.all(np.isfinite(array)) and np.array_equal(array, np.trunc(array))):
            raise ValueError("has values that are not whole numbers")
        return array.astype(spec.dtype)
    except (TypeError, ValueError, OverflowError) as exc:
        raise _bad(
            f"Data is not compatible with model signature. Failed to convert column {alias} to type "
            f"'{spec.dtype.name if spec.dtype.kind != 'O' else 'str'}'. Error: '{exc!r}'"
        ) from None


# --------------------------------------------------------------------------------------------- answers
def encode_predictions(outputs: Mapping[str, np.ndarray]) -> bytes:
    """``{"predictions": ...}`` as MLflow writes a model's answer (see the module's description)."""
    arrays = list(outputs.items())
    if len(arrays) == 1:
        predictions: Any = _jsonable(arrays[0][1])
    elif arrays and all(a.ndim == 1 and len(a) == len(arrays[0][1]) for _, a in arrays):
        lists = [(name, _jsonable(a)) for name, a in arrays]
        predictions = [{name: values[i] for name, values in lists} for i in range(len(arrays[0][1]))]
    else:
        predictions = {name: _jsonable(a) for name, a in arrays}
    return json.dumps({"predictions": predictions}).encode()


def _jsonable(array: np.ndarray) -> Any:
    if array.dtype.kind in "OSU":
        return _strings(array.tolist())
    if array.dtype.kind == "M":
        return np.datetime_as_string(array).tolist()
    return array.tolist()


def _strings(value: Any) -> Any:
    """Bytes as text (a model's strings), or as base64 where they are not UTF-8 (MLflow's binary values)."""
    if isinstance(value, list):
        return [_strings(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return base64.encodebytes(bytes(value)).decode("ascii")
    if isinstance(value, np.generic):
        return value.item()
    return value
