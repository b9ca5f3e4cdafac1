"""What the traced bytes of a run must be against the I/O model, shared by the tiers that
train (root on a loop device, vm on throttled NVMe drives and md arrays)."""

from __future__ import annotations

MIB = 1 << 20


#: what reads move beyond DeepSpeed's files in a step: the filesystem's own blocks (an inode,
#: an extent block, a directory) read again where the kernel dropped them from its cache, as
#: it does on a host with work beside the run (a 4 KiB read seen under load)
FS_READS = 64 * 1024
#: what those reads can add: whole blocks of 4 KiB
FS_BLOCKS = range(0, FS_READS + 1, 4096)


def param_reads_shift_ok(off: int, n_p: int, whole: tuple[int, ...] = (0, MIB // 2)) -> bool:
    """A steady step of parameter offload reads the model's bytes give or take whole
    parameter files: a parameter still in a swap buffer at the optimizer step is updated
    there and not read again, and the prefetch may pull the next forward's in before the
    step's end. Whole files are multiples of 1 MiB (the fp32 files of the tiny presets) or
    of half of it, and never more than one fetch of them all (4 bytes an element). *whole*:
    the remainders modulo 1 MiB whole files leave (a model of one's own: its tensors' sizes,
    padded to pages). Up to FS_READS more, in whole 4 KiB blocks: the filesystem's, never fewer."""
    if not -4 * n_p <= off <= 4 * n_p + FS_READS:
        return False
    shifts = {w % MIB for w in whole} | {-w % MIB for w in whole}
    return any((off - s) % MIB in FS_BLOCKS for s in shifts)


#: a model of one's own: its parameter files hold its own tensors (not the presets' MiB
#: multiples), each padded to the AIO alignment, a page here
PAGES = tuple(range(0, MIB, 4096))
