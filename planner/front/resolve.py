"""Find a model file (a path or ``zoo:NAME``), read it, and parse it into a checked proto,
refusing external weight data that points outside the model's folder."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from fuseplan.planner.core.errors import InputError
from fuseplan.planner.front.work import _one_line

ZOO: dict[str, str] = {
    name: f"light_{name}.onnx"
    for name in (
        "resnet50",
        "vgg19",
        "bvlc_alexnet",
        "zfnet512",
        "squeezenet",
        "inception_v1",
        "inception_v2",
        "densenet121",
        "shufflenet",
    )
}
"""Zoo name -> file name of the "light" test models shipped inside the onnx package."""
_ZOO_PREFIX = "zoo:"


def zoo_dir() -> Path:
    """Directory holding the light zoo models inside the installed onnx package."""
    return Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def resolve_model(spec: str) -> Path:
    """Turn a model path or ``zoo:NAME`` into an existing file path.

    Raises InputError for an unknown zoo name (listing the valid names) or a missing file.
    """
    if spec.startswith(_ZOO_PREFIX):
        return _resolve_zoo(spec)
    path = Path(spec).expanduser()
    if not path.exists():
        raise InputError(
            f"Model file '{spec}' does not exist. Check the path, or use zoo:NAME for a "
            f"bundled model ({', '.join(ZOO)})."
        )
    if not path.is_file():
        raise InputError(
            f"Model path '{spec}' is not a regular file. Pass the path of an .onnx file."
        )
    return path


def _resolve_zoo(spec: str) -> Path:
    name = spec[len(_ZOO_PREFIX):]
    if name not in ZOO:
        close = difflib.get_close_matches(name, list(ZOO), n=1)
        hint = f" Did you mean 'zoo:{close[0]}'?" if close else ""
        raise InputError(
            f"Unknown zoo model '{name}' in '{spec}'.{hint} Valid names: "
            f"{', '.join(ZOO)}. Pass zoo:NAME with one of them as MODEL, or a path to an "
            ".onnx file."
        )
    path = zoo_dir() / ZOO[name]
    if not path.is_file():
        raise InputError(
            f"Zoo model '{spec}' should be at '{path}' but the installed onnx package does "
            "not ship it. Reinstall onnx (the full wheel includes its backend test data) or "
            "pass a model file path instead."
        )
    return path


def _read_bytes(file: Path, spec: str) -> bytes:
    try:
        return file.read_bytes()
    except OSError as exc:
        raise InputError(
            f"Model file '{spec}' cannot be read ({exc.strerror or exc}). Check the path and "
            "its permissions."
        ) from exc


def _not_onnx(spec: str, why: str) -> InputError:
    return InputError(
        f"Model file '{spec}' is not a readable ONNX model ({why}). Pass an .onnx file "
        "exported by a framework (e.g. torch.onnx.export); if it was copied or downloaded, "
        "check that the transfer completed."
    )


def _parse_model(data: bytes, file: Path, spec: str) -> onnx.ModelProto:
    """Parse, load external data, and lightly check the model."""
    if not data:
        raise _not_onnx(spec, "the file is empty")
    try:
        proto = onnx.load_model_from_string(data)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise _not_onnx(spec, f"protobuf decoding failed: {exc}") from exc
    if not proto.HasField("graph") or not proto.opset_import or not proto.graph.output:
        raise _not_onnx(spec, "it has no graph, opset or outputs")
    if _external_tensors(proto):
        _check_external_data(proto, file, spec)  # before onnx reads a byte of it
        try:
            onnx.load_external_data_for_model(proto, str(file.parent))
        except (OSError, ValueError, onnx.checker.ValidationError) as exc:
            raise InputError(
                f"Model file '{spec}' refers to external weight data that cannot be read "
                f"({_one_line(str(exc))}). Keep the external data files next to the model, "
                "as they were saved with it."
            ) from exc
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as exc:
        raise _not_onnx(spec, f"the ONNX checker rejected it: {_one_line(str(exc))}") from exc
    except ValueError:  # over 2 GB: the C++ checker needs the file itself
        try:
            onnx.checker.check_model(str(file))
        except onnx.checker.ValidationError as exc:
            raise _not_onnx(spec, f"the ONNX checker rejected it: {_one_line(str(exc))}") from exc
    return proto


def _graph_tensors(graph: onnx.GraphProto) -> Iterable[onnx.TensorProto]:
    """Every tensor stored in a graph: initializers and node attributes, subgraphs included."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _graph_tensors(attr.g)
            for sub in attr.graphs:
                yield from _graph_tensors(sub)


def _external_tensors(proto: onnx.ModelProto) -> list[onnx.TensorProto]:
    tensors = list(_graph_tensors(proto.graph))
    for function in proto.functions:
        for node in function.node:
            for attr in node.attribute:
                if attr.HasField("t"):
                    tensors.append(attr.t)
                tensors.extend(attr.tensors)
    return [t for t in tensors if t.data_location == onnx.TensorProto.EXTERNAL]


def _check_external_data(proto: onnx.ModelProto, file: Path, spec: str) -> None:
    """Every external-data location is a regular file inside the model's folder (symlinks
    resolved): checked on the location strings, so nothing outside is ever opened."""
    folder = file.resolve().parent
    fix = ("Keep the external data files in the model's folder (or below it) and refer to "
           "them by relative paths, as onnx.save(..., save_as_external_data=True) writes them.")
    for tensor in _external_tensors(proto):
        entries = {e.key: e.value for e in tensor.external_data}
        location = entries.get("location", "")
        name = tensor.name or "(unnamed)"
        if not location:
            raise InputError(
                f"Model file '{spec}': tensor '{name}' is stored externally but names no "
                f"location for its data. {fix}")
        if "\0" in location:
            raise InputError(
                f"Model file '{spec}': tensor '{name}' names its external data file "
                f"{location!r}, which holds a NUL character; fuseplan refuses it as unsafe. "
                f"{fix}")
        target = Path(location)
        if target.is_absolute() or target.drive or "\\" in location:
            raise InputError(
                f"Model file '{spec}': tensor '{name}' points its external data at the absolute "
                f"(or drive or backslash) path '{location}'; fuseplan refuses it as unsafe and "
                f"reads nothing there. {fix}")
        resolved = (folder / target).resolve()
        if not resolved.is_relative_to(folder):
            raise InputError(
                f"Model file '{spec}': tensor '{name}' points its external data at "
                f"'{location}', outside the model's folder '{folder}'; fuseplan refuses it as "
                f"unsafe and reads nothing there. {fix}")
        if not resolved.is_file():
            missing = "does not exist" if not resolved.exists() else "is not a regular file"
            raise InputError(
                f"Model file '{spec}': tensor '{name}' keeps its data in external file "
                f"'{location}', which {missing} (looked for '{resolved}'). Copy the external "
                "data file next to the model, where it was saved with it, or save the model "
                "with its weights inside (onnx.save without save_as_external_data).")
