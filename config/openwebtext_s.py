# openwebtext, scale S (~0.12B parameters): paper arXiv 2608.02668, Tables 6 and 7.
#
#   torchrun --standalone --nproc_per_node=8 train.py config/openwebtext_s.py --connection=p_spheret --spheret_p=0.5
#
# Only what differs between scales is set here; every other value is the paper's shared
# setting, the default in spheretnorm/runtime/config/train_config.py and spheretnorm/model.py. Output: out/openwebtext_s/<method>/.
dataset = "openwebtext"
n_layer = 12
n_head = 12
n_embd = 768
learning_rate = 6e-4
min_lr = 6e-5
