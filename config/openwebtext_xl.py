# openwebtext, scale XL (~1.56B parameters, GPT-2 XL's shape): past the paper, which stops at L
# (arXiv 2608.02668, Tables 6 and 7). Its S, M and L learning rates (6e-4, 3e-4, 2.5e-4, min_lr a
# tenth) are GPT-3's for 125M, 350M and 760M parameters; XL takes the next row of that table (1.3B:
# 2e-4). Everything else is the paper's shared setting, as in the other scales.
#
#   torchrun --standalone --nproc_per_node=8 train.py config/openwebtext_xl.py --connection=p_spheret --spheret_p=0.5
#
# FSDP2 shards weights, gradients and AdamW over the GPUs (3.2 GiB a GPU of 8 instead of 23 GiB).
# The activations are far more: about 42 GiB a GPU at batch_size 16 (5.6 GiB with
# --activation_checkpointing=true), and 9 GiB for the logits at the loss (README "Memory per GPU").
# Output: out/openwebtext_xl/<method>/ (a sharded checkpoint, ckpt.dcp; scripts/consolidate.py makes a ckpt.pt).
dataset = "openwebtext"
n_layer = 48
n_head = 25
n_embd = 1600
learning_rate = 2e-4
min_lr = 2e-5
parallel = "fsdp"
