"""``python -m flwr_fsl.helper``: the ``flwr-fsl-helper`` command (:mod:`flwr_fsl.helper.cli`)."""

from flwr_fsl.helper.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
