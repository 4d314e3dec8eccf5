# fineweb_edu, scale M (~0.35B parameters): paper arXiv 2608.02668, Tables 6 and 7.
#
#   torchrun --standalone --nproc_per_node=8 train.py config/fineweb_edu_m.py --connection=p_spheret --spheret_p=0.5
#
# Only what differs between scales is set here; every other value is the paper's shared
# setting, the default in spheretnorm/runtime/config/train_config.py and spheretnorm/model.py. Output: out/fineweb_edu_m/<method>/.
dataset = "fineweb_edu"
n_layer = 24
n_head = 16
n_embd = 1024
learning_rate = 3e-4
min_lr = 3e-5
