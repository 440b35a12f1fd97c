"""Helpers the xDS tests share: `require` (a client package: skipped when
missing, but under CI (CI=1) a missing package fails the test), and
`check_resource`, which validates an xDS resource against the
protoc-gen-validate annotations carried by Envoy's own protos (xds-protos),
descending into every `Any` it holds (filters' typed configs, transport
sockets, API listeners...), as Envoy does when it accepts a config."""

import importlib
import os

import pytest


def require(module):
    """`module` imported; missing: skip, or fail under CI."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if os.environ.get("CI"):
            pytest.fail(f"{module} is required under CI: {e}")
        pytest.skip(f"{module} is not installed: {e}")


class _Field:
    """A field descriptor with the `label` protobuf 7 removed, which
    protoc-gen-validate 1.3.3's generator still reads."""

    def __init__(self, field):
        self._field = field

    def __getattr__(self, name):
        return getattr(self._field, name)

    @property
    def label(self):
        return 3 if self._field.is_repeated else 1


def _validator():
    v = require("protoc_gen_validate.validator")
    if not getattr(v, "_cairn_patched", False):
        from google.protobuf.descriptor import FieldDescriptor
        if not hasattr(FieldDescriptor, "label"):
            rule_type = v.rule_type
            v.rule_type = lambda field: rule_type(_Field(field))
        v._cairn_patched = True
    return v


def _message_class(type_url):
    from google.protobuf import symbol_database
    name = type_url.rsplit("/", 1)[-1]
    return symbol_database.Default().GetSymbol(name)


def _import_for(type_url):
    """Loads the xds-protos module that defines a type (its file is named
    by the package path), so the symbol database knows it."""
    name = type_url.rsplit("/", 1)[-1]
    parts = name.split(".")
    from google.protobuf import descriptor_pool
    try:
        descriptor_pool.Default().FindMessageTypeByName(name)
        return
    except KeyError:
        pass
    # envoy.extensions.filters.http.router.v3.Router lives in
    # envoy/extensions/filters/http/router/v3/router_pb2.py.
    pkg = ".".join(parts[:-1])
    mod = importlib.import_module(pkg)
    for f in os.listdir(os.path.dirname(mod.__file__) if hasattr(mod, "__file__") and mod.__file__
                        else list(mod.__path__)[0]):
        if f.endswith("_pb2.py"):
            importlib.import_module(f"{pkg}.{f[:-3]}")


def _walk(msg, path, failures):
    from google.protobuf import any_pb2
    v = _validator()
    try:
        v.validate(msg)
    except v.ValidationFailed as e:
        failures.append(f"{path} ({msg.DESCRIPTOR.full_name}): {e}")
    for field, value in msg.ListFields():
        if field.message_type is None:
            continue
        if field.message_type.GetOptions().map_entry:
            items = [(f"{path}.{field.name}[{k}]", value[k]) for k in value]
            if field.message_type.fields_by_name["value"].message_type is None:
                continue
        elif field.is_repeated:
            items = [(f"{path}.{field.name}[{i}]", x) for i, x in enumerate(value)]
        else:
            items = [(f"{path}.{field.name}", value)]
        for p, m in items:
            if isinstance(m, any_pb2.Any):
                _import_for(m.type_url)
                inner = _message_class(m.type_url)()
                assert m.Unpack(inner), f"{p}: cannot unpack {m.type_url}"
                _walk(inner, f"{p}<{inner.DESCRIPTOR.name}>", failures)
            else:
                _walk(m, p, failures)


def check_resource(msg):
    """Every validation failure in `msg` and what it holds (empty: valid)."""
    failures = []
    _walk(msg, msg.DESCRIPTOR.name, failures)
    return failures


def check_any(any_msg):
    """`check_resource` of a packed resource."""
    _import_for(any_msg.type_url)
    inner = _message_class(any_msg.type_url)()
    assert any_msg.Unpack(inner), f"cannot unpack {any_msg.type_url}"
    return check_resource(inner)
