"""Job spec (pydantic) and output table (pyarrow) schemas. Imports nothing else of the project."""

from schemas.output import OUTPUT_COLUMNS, OUTPUT_SCHEMA, SCHEMA_VERSION
from schemas.spec import JobSpec

__all__ = ["JobSpec", "OUTPUT_COLUMNS", "OUTPUT_SCHEMA", "SCHEMA_VERSION"]
