# Archive mode (`--config archive=DIR`, `make figures`): the run files of the preset come from a
# run archive (rspo/archive.py: DIR/archive.json + DIR/runs.tar.xz), checked and unpacked by one
# job; the report rules then build every table and figure from them. No data, pretrain, train or
# evaluate rule exists in this mode. Everything goes to results/<preset>-archive (R), never to the
# user's results/<preset>; other files already under R stop the workflow before any job (unpacking
# never overwrites them).


def _archive_outputs():
    """The unpacked files; refuses results/<preset> holding other versions of them."""
    import hashlib

    outputs, clash = [], []
    for m in ARCHIVE_MANIFEST["members"]:
        path = Path(R, m["path"])
        outputs.append(str(path))
        if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() != m["sha256"]:
            clash.append(m["path"])
    if clash:
        raise WorkflowError(
            f"{R} holds other versions of the archive's files ({', '.join(clash[:4])}, ...): archive mode "
            f"would replace them; delete {R} (it holds only what `make figures` built) and run it again"
        )
    return outputs


rule unpack_archive:
    input:
        manifest=f"{ARCHIVE}/archive.json",
        bundle=f"{ARCHIVE}/runs.tar.xz",
    output:
        _archive_outputs(),
    log:
        f"{R}/logs/archive/unpack.log",
    conda:
        ENV_CPU
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
        gpu=0,
    params:
        archive=ARCHIVE,
        preset=PRESET_FILE,
    shell:
        "python -m rspo archive unpack {params.archive} --preset {params.preset} --into {R} > {log} 2>&1"
