"""Code generation shared by every backend: the C-style printer base (``cstyle``) and identifier
sanitizing (``names``). Each backend's printer lives in its folder under ``compiler/backends``."""
