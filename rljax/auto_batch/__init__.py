"""P=auto (config.auto_batch): the batch chosen during the run (docs/guide/auto_batch.md).

rule      which batch, from the gradient noise scale and measured samples/s (pure numbers)
check     whether a move made the progress per sample it predicted, measured on the reward
state     the run's P=auto state (plain JSON in the checkpoint), its decision points and looks
schedule  the loop's side: measure each step, switch the run, compile other batches ahead
"""
