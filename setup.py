"""The compiled module wakustore._native (native/native.c: the per-message
loops of a hydrating member), built by `pip install` with the machine's C
compiler against OpenSSL's libcrypto. Everything else is in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "wakustore._native",
            sources=["native/native.c"],
            libraries=["crypto"],
            extra_compile_args=["-O2", "-Wall", "-Werror"],
        )
    ]
)
