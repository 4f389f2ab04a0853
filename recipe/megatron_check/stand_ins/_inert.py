"""Inert attributes for the import-time stand-ins beside this file."""


class Inert(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Inert(f"{cls.__name__}.{name}", (), {})

    def __call__(cls, *args, **kwargs):
        raise RuntimeError(f"import-time stand-in: {cls.__name__} was called (the real package is not installed)")


def module_getattr(module: str):
    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Inert(f"{module}.{name}", (), {})

    return __getattr__
