"""Reading launcher variables with errors that name the variable and its value."""

from __future__ import annotations

from collections.abc import Mapping


def require_env(env: Mapping[str, str], name: str) -> str:
    value = env.get(name, "")
    if not value:
        raise ValueError(f"environment variable {name} is missing or empty")
    return value


def env_int(env: Mapping[str, str], name: str, *, minimum: int = 0) -> int:
    value = require_env(env, name)
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r}: expected a whole number") from None
    if number < minimum:
        raise ValueError(f"environment variable {name}={number}: expected at least {minimum}")
    return number
