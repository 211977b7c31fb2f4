"""nestplan: network- and memory-aware planning of distributed LLM training.

Import the pieces you need from their modules; nothing heavy is loaded here::

    >>> from nestplan.evaluate import evaluate_names
    >>> ev = evaluate_names("gpt3-175b", "selene-a100-hdr", 1024, tp=8, pp=8, mbs=1,
    ...                     global_batch=1536, seq_len=2048, recompute="full")
    >>> ev.fits
    True
"""

__version__ = "0.1.0"
