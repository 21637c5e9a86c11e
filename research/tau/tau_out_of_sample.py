"""Out-of-sample check of temperature constants (not a timed test): Prox − Base at every fixed setting of
research/tau/tau_selection.py (1/tau, rel:a, spr:a, mix:…) on 10 KMeans and 10 kNN configurations that its study never
used (``OUT_OF_SAMPLE``: other outlier sets and protocols of the same three tables), seeds 42, 7, 99. No CV:
the question is whether a constant picked on the study's configurations carries over. The same as

    python research/tau/tau_selection.py --configs out-of-sample --no-cv [--json …]

and with the CV rules too: ``python research/tau/tau_selection.py --configs out-of-sample``.

    python research/tau/tau_out_of_sample.py [--json out/tau_out_of_sample.json]     (~5 min with cached embeddings)
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tau_selection import main  # noqa: E402

if __name__ == "__main__":
    main(["--configs", "out-of-sample", "--no-cv", *sys.argv[1:]])
