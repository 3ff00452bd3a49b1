"""rows-app: the ServerApp, S0 of an index-mode round with S1 as the run config says."""

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp

from flwr_fsl.helper import connect_helper
from flwr_fsl.strategies import SecureRowFedSubAvg
from quickstart_app.task import Net

# Create ServerApp
app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Main entry point for the ServerApp."""
    fraction_train: float = context.run_config["fraction-train"]
    num_rounds: int = context.run_config["num-server-rounds"]
    lr: float = context.run_config["lr"]
    arrays = ArrayRecord(Net().state_dict())

    helper, fingerprint = connect_helper(context.run_config)
    strategy = SecureRowFedSubAvg(
        helper, "item_emb.weight", 64, fraction_train=fraction_train, helper_fingerprint=fingerprint
    )
    result = strategy.start(
        grid=grid,
        initial_arrays=arrays,
        num_rounds=num_rounds,
        train_config=ConfigRecord({"lr": lr}),
    )
    helper.close()

    # Save final model to disk
    state_dict = result.arrays.to_torch_state_dict()
    torch.save(state_dict, context.run_config.get("model-path", "final_model.pt"))
