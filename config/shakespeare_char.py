# A small character-level model on Tiny Shakespeare that trains on a laptop CPU in minutes.
#
#   python data/prepare.py shakespeare_char   # the copy embedded in data/, offline
#   python train.py config/shakespeare_char.py --connection=p_spheret --spheret_p=0.5
#
# 2,000 iterations reach val loss 1.67 (pre_ln). Measured 2026-12-01 on 2 idle CPU cores with torch's
# default threads: 0.16 s per iteration (pre_ln), 0.18 s (p_spheret, after compiling the fused update
# for training: ~10 s the first time, ~3 s in later processes; sampling compiles nothing); on a
# machine shared with other jobs, set OMP_NUM_THREADS (see README).
# The paper's hyperparameters are for GPUs; this file only has to be quick and sensible.
dataset = "shakespeare_char"
n_layer = 4
n_head = 4
n_embd = 128
block_size = 128
batch_size = 32
global_batch_size = 32
learning_rate = 1e-3
min_lr = 1e-4
max_iters = 2000  # lr_decay_iters follows it: --max_iters=200 decays to min_lr by iteration 200
warmup_iters = 100
eval_interval = 250
eval_iters = 20
log_interval = 50
