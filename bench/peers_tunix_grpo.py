"""Tunix GRPO steps for bench/peers.py (imported by bench/peers_tunix.py inside Tunix's venv).

Same step as the rljax side: P prompts x G responses of `max_new_tokens` tokens sampled at
temperature 1 with log-probs, the same token-level reward, group advantages, no KL (beta=0), one
Adam update per batch, actor and rollout on the same single-device mesh (Tunix's "colocated" set-up,
sharing one set of weights). The step time is read off the training loop itself: the data iterator
is asked for batch n+1 when step n is done.
"""
import tempfile
import time

import jax
import numpy as np
import optax
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.grpo import grpo_learner
from tunix.rl.rollout import base_rollout
from tunix.sft import metrics_logger

from bench import peers_tunix


def token_reward(prompts, completions, **_):
  """The rljax side's reward (bench/peers.py): share of even token ids in the completion."""
  del prompts
  return [float(np.mean([int(t) % 2 == 0 for t in c.split()])) if c.split() else 0.0
          for c in completions]


def run(worker, request):
  P, G, steps = request['P'], request['G'], request['steps']
  spec = worker.spec
  mesh = jax.make_mesh((1, 1), ('fsdp', 'tp'), axis_types=(jax.sharding.AxisType.Auto,) * 2)
  model, _ = peers_tunix.build_model(spec['model'])
  log_dir = tempfile.mkdtemp(prefix='tunix-bench-')
  training = rl_cluster_lib.RLTrainingConfig(
      actor_optimizer=optax.adam(1e-5), eval_every_n_steps=10_000, max_steps=steps + 1,
      mini_batch_size=P, train_micro_batch_size=P,
      metrics_logging_options=metrics_logger.MetricsLoggerOptions(log_dir=log_dir),
      pbar_description=None)
  rollout = base_rollout.RolloutConfig(
      max_tokens_to_generate=spec['max_new_tokens'], max_prompt_length=spec['prompt_len'],
      kv_cache_size=spec['prompt_len'] + spec['max_new_tokens'] + 8, temperature=1.0, top_p=1.0,
      eos_tokens=[worker.tokenizer.eos_id()], return_logprobs=True)
  cluster = rl_cluster_lib.RLCluster(
      actor=model, tokenizer=worker.tokenizer,
      cluster_config=rl_cluster_lib.ClusterConfig(
          role_to_mesh={rl_cluster_lib.Role.ACTOR: mesh, rl_cluster_lib.Role.ROLLOUT: mesh,
                        rl_cluster_lib.Role.REFERENCE: mesh},
          rollout_engine='vanilla', training_config=training, rollout_config=rollout))
  learner = grpo_learner.GRPOLearner(
      rl_cluster=cluster, algo_config=grpo_learner.GRPOConfig(num_generations=G, beta=0.0),
      reward_fns=[token_reward])
  stamps = []

  def batches():
    for n in range(steps + 1):
      stamps.append(time.perf_counter())
      yield dict(prompts=np.array(peers_tunix.prompts_text(P, spec['prompt_len'],
                                                           spec['model']['vocab_size'], seed=n)))
    stamps.append(time.perf_counter())

  start = time.perf_counter()
  learner.train(batches())
  total = time.perf_counter() - start
  times = list(np.diff(stamps))
  return dict(times=times[1:], first_s=times[0], total_s=total, stamps=len(stamps))
