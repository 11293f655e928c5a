# RSPO reproduction workflow: data -> pretrain -> RL runs -> evaluation -> paper tables/figures.
#
#   snakemake --cores all                        # configs/small.yaml (default preset)
#   snakemake --cores all --config preset=smoke  # another preset; seeds=[0,1,2] replaces seeds
#   snakemake --cores all fig4_plugin | table_main | results/small/figures/fig4_plugin.pdf
#   snakemake --profile cluster --config preset=paper_small   # SLURM (see cluster/)
#   snakemake --report report.html               # HTML report with every figure and caption
#
# Rules are thin wrappers around `python -m rspo <command>`; the preset (configs/<name>.yaml,
# checked against workflow/schemas/preset.schema.yaml) is the single source of truth for the run
# grid (rspo/grid.py) and for which runs each table and figure needs (rspo/plan.py).

from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version

from rspo.config import ConfigError
from rspo.plan import validate_preset

min_version("9.0")


configfile: "workflow/config.yaml"


# the config's keys and values (--config ...), each mistake named in one line with the valid keys
try:
    validate_preset(config, "workflow/schemas/config.schema.yaml", where="--config")
except ConfigError as e:
    raise WorkflowError(str(e)) from None


include: "workflow/rules/common.smk"


# `--config archive=DIR`: the run files come from a run archive; no data, pretrain, train or
# evaluate job exists, the report targets build from the unpacked files (rspo/archive.py).
if ARCHIVE:

    include: "workflow/rules/archive.smk"

else:

    include: "workflow/rules/data.smk"
    include: "workflow/rules/pretrain.smk"
    include: "workflow/rules/train.smk"
    include: "workflow/rules/evaluate.smk"


include: "workflow/rules/report.smk"


# `--config trials=FILE`: the regime search's trials as jobs (target `trials`, rspo/sweep.py).
if config.get("trials"):

    include: "workflow/rules/trials.smk"


report: "workflow/report/workflow.rst"


localrules:
    all,
    fig_plugin_small,


# Create the MLflow store, the preset's experiment and its report run once, before any job
# starts: concurrent jobs creating them race (rspo/tracking.py). A store that cannot be reached
# (a tracking server that is down) is a warning, not a failure: jobs record what they can and
# `python -m rspo mlflow-sync` the rest.
onstart:
    training_notice(workflow.dag)
    shell(f"python -m rspo mlflow-init --best-effort --preset {PRESET_FILE}")


rule all:
    default_target: True
    input:
        all_targets(),
