"""Configuration: a TOML file (``loader``, ``toml_source``) validated into a model
(``model``) that builds a Receiver. Above the entry points; only the CLI imports it.
"""
