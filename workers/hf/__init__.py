"""Compressed students as ``transformers`` models: ``save_student`` writes a folder that
``AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`` loads, with the
student's reduced shapes (``modeling_transformer_alloc.py`` is the standalone model it ships)."""

__all__ = ["export"]  # the public module (transformers is imported only when it is)
