"""Compression settings: the base model every method's settings subclass, and discovery.

Contract: ``CompressionSpec`` subclasses register themselves by ``method`` name when
defined. The compression methods live in stages/compression/ (one module each: its
settings and its declaration); schemas import nothing of the project statically, so
the first time a spec's ``compression`` is validated or its JSON Schema is built,
``compression_models`` loads that package by name (``COMPRESSION_PLUGINS``): plugin
discovery. ``JobSpec.compression`` (schemas/spec.py) validates a mapping with
``validate_compression`` (a discriminated union on ``method`` over the registered
models, so errors read ``compression.keep: ...`` / ``compression.method: got 'zip';
allowed: ...``) and documents itself with ``CompressionJsonSchema`` (oneOf by method).
"""

from __future__ import annotations

import functools
import importlib
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import Field, GetJsonSchemaHandler, TypeAdapter, model_validator

from schemas.spec_base import _Strict

#: The package whose modules define the compression methods (stages/compression/). The
#: spec cannot import it (schemas import nothing of the project), so it is loaded by
#: name the first time a method's settings are validated or listed: plugin discovery.
COMPRESSION_PLUGINS = "stages.compression"


class CompressionSpec(_Strict):
    """Base of every compression method's settings; one subclass per method.

    A subclass declares ``method: Literal["<name>"] = "<name>"`` and is registered
    under that name when it is defined (``__pydantic_init_subclass__``). The method
    modules of ``COMPRESSION_PLUGINS`` define them next to their method class, so
    ``JobSpec.compression`` accepts exactly the methods that exist.
    """

    # _Strict: frozen, unknown keys refused, numbers finite, no booleans or >64-bit integers.
    method: str = Field(description="Compression method name.")
    _by_method: ClassVar[dict[str, type[CompressionSpec]]] = {}
    #: Settings added after jobs already ran with the method: left out of the generation
    #: fingerprint while at their default (``fingerprint_settings``), so the request ids of
    #: a date written before they existed stay the same and a rerun after an upgrade skips
    #: those rows instead of writing them again under new ids.
    fingerprint_omits_default: ClassVar[tuple[str, ...]] = ()
    #: The kept context is a function of the document alone (never of the question) and
    #: the decode engine prefills the prompt itself: requests on one document then share
    #: every prompt token before the question, which the engine's prefix cache prefills
    #: once (``generation.prefix_cache``, stages/decoding/prefix_cache.py).
    shares_document_prefix: ClassVar[bool] = False

    @property
    def budget_tokens(self) -> int | None:
        """The method's context budget in the generator's tokens (``target_tokens``), None
        for a method without one (none) or where it is unset: the output's ``target_tokens``."""
        return getattr(self, "target_tokens", None)

    @model_validator(mode="before")
    @classmethod
    def _unset_is_absent(cls, data: Any) -> Any:
        # A setting this method does not take, set to null, is no setting: a spec written for
        # one method can switch to another from the command line (`--set compression.method=none
        # --set compression.target_tokens=null`) without editing the file.
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None or k in cls.model_fields}
        return data

    def fingerprint_settings(self) -> dict[str, Any]:
        """These settings as JSON for the generation fingerprint (stages/requests.py), less the
        ``fingerprint_omits_default`` fields that are at their default."""
        settings = self.model_dump(mode="json")
        for name in self.fingerprint_omits_default:
            if getattr(self, name) == type(self).model_fields[name].default:
                settings.pop(name, None)
        return settings

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        name = cls.model_fields["method"].default
        if not isinstance(name, str) or not name:
            raise TypeError(f"{cls.__name__}.method needs its method name as default")
        known = CompressionSpec._by_method.get(name)
        if known is not None and known.__qualname__ != cls.__qualname__:
            raise TypeError(f"compression method {name!r} is defined twice: {known} and {cls}")
        CompressionSpec._by_method[name] = cls


def compression_models() -> dict[str, type[CompressionSpec]]:
    """Every registered method's settings model by name (sorted), plugins loaded first."""
    importlib.import_module(COMPRESSION_PLUGINS)
    return dict(sorted(CompressionSpec._by_method.items()))


@functools.lru_cache(maxsize=8)
def _union_adapter(models: tuple[type[CompressionSpec], ...]) -> TypeAdapter:
    # A discriminated union over the registered models, built when they are known; its
    # errors read exactly like a static union's (compression.truncate.keep, unknown tag).
    union = Union[models] if len(models) > 1 else models[0]  # noqa: UP007 - built at run time
    return TypeAdapter(Annotated[union, Field(discriminator="method")])


def _compression_adapter() -> TypeAdapter:
    return _union_adapter(tuple(compression_models().values()))


def validate_compression(value: Any) -> Any:
    """JobSpec.compression before-validator: a mapping -> its method's settings model."""
    if isinstance(value, CompressionSpec) and type(value) is not CompressionSpec:
        return value
    if isinstance(value, CompressionSpec):
        value = value.model_dump()
    return _compression_adapter().validate_python(value)


class CompressionJsonSchema:
    """JSON Schema of JobSpec.compression: oneOf every registered method, by ``method``."""

    def __get_pydantic_json_schema__(self, core_schema: Any, handler: GetJsonSchemaHandler) -> Any:
        return handler(_compression_adapter().core_schema)


class NoCompression(CompressionSpec):
    """The whole document (it must fit the model's context)."""

    method: Literal["none"] = "none"
    shares_document_prefix: ClassVar[bool] = True
