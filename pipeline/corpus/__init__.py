"""Eval-corpus build tooling (not imported by the runtime pipeline): reST -> plain text, QA sets."""
