//! `cargo xtask softroce [--] CMD [ARGS...]`: runs one command inside a throwaway QEMU guest
//! that boots Debian's own kernel with SoftRoCE (`rdma_rxe`) set up: real ibverbs RC QPs on a
//! machine without an RDMA NIC (DESIGN.md, "Test rigs").
//!
//! What it does:
//! - Installs what it misses, with apt when root (busybox-static, ibverbs-providers, xz-utils,
//!   and ibverbs-utils, perftest, rdmacm-utils so a command can run `ibv_devinfo`,
//!   `ib_write_bw`, `rping`: `prereq::Group::Softroce`). Not root: says what to install.
//!   QEMU is the installed `qemu-system-x86_64`, else Debian's unpacked into the cache
//!   (installing it would remove the image's newer `qemu-utils`; see softroce/qemu.rs).
//! - Kernel: whatever `linux-image-amd64` depends on now, fetched with `apt-get download` and
//!   unpacked (only the parts needed) without installing it; cached. Its vmlinux is extracted
//!   from the bzImage and booted through the PVH entry (skips a ~6 s xz decompression under
//!   TCG); the bzImage is the fallback.
//! - Initramfs (cached, keyed by a hash of its inputs): static busybox, the modules needed
//!   with their dependencies, and the `/init` below.
//! - Guest: host `/` read-only over 9p under a tmpfs overlay (host binaries run as they are;
//!   writes are thrown away, except under `RXE_VM_RW`), `rdma_rxe` loaded, `rxe0` created on a
//!   dummy netdev with 192.0.2.1/24 (`-nic none`: nothing leaves the guest). CMD runs as root
//!   in the current directory with the host's environment plus `RDMA_DEV` (rxe0),
//!   `RDMA_GID_INDEX` (the IPv4-mapped RoCEv2 GID; index 0 is link-local) and `RDMA_IP`.
//!   Its stdout and stderr come back merged on stdout (a tty inside only when stdout is one);
//!   this task's own messages go to stderr.
//! - Exit status: CMD's; 125 when the guest never reported one (set-up error, boot failure,
//!   crash, timeout); 2 on a usage error.
//!
//! Environment knobs:
//! - `RXE_VM_CACHE`: cache dir (default `$XDG_CACHE_HOME/rxe-vm`, else `~/.cache/rxe-vm`;
//!   the kernel part is laid out as the shared shell script's, so both can share it).
//! - `RXE_VM_ACCEL`: `auto` (default: KVM only when /dev/kvm is writable and the CPU shows
//!   vmx/svm; an auto-chosen KVM guest that is not up within 60 s is retried under TCG),
//!   `kvm` or `tcg`.
//! - `RXE_VM_MEM` guest RAM (default 2G), `RXE_VM_CPUS` vCPUs (default: host CPUs),
//!   `RXE_VM_TIMEOUT` seconds before the guest is killed (default 3000), `RXE_VM_IP` address
//!   of the rxe netdev (default 192.0.2.1), `RXE_VM_RW` space-separated host dirs shared
//!   read-write, `RXE_VM_QEMU_CPU` the `-cpu` model under TCG (default max), `RXE_VM_DEBUG=1`
//!   kernel messages and the init trace (printed after the run).
//!
//! Facts (Debian 12, kernel 6.1, on these machines):
//! - KVM cannot boot Debian's kernel here (the host's /dev/kvm is a paravirtual flavour, and
//!   the CPU shows no vmx/svm): the guest runs under TCG. Boot is the fixed cost (seconds):
//!   run a whole test suite in one guest.
//! - There is one rxe device: use two QPs on it (loopback RC works: perftest, rdma_cm,
//!   host-built Rust test binaries). Two network namespaces with one rxe each do NOT work on
//!   6.1 (rxe lives in the initial namespace).
//! - Under TCG, ib_write_bw gives tens of MB/s and ib_write_lat tens of µs: good for
//!   correctness, not for absolute performance.
//!
//! Example:
//! `cargo xtask softroce -- bash -c 'ib_write_bw -d $RDMA_DEV -x $RDMA_GID_INDEX -F -D 3 >/tmp/s.log 2>&1 & sleep 1; ib_write_bw -d $RDMA_DEV -x $RDMA_GID_INDEX -F -D 3 $RDMA_IP'`

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io::{IsTerminal, Write};
use std::net::Ipv4Addr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const USAGE: &str = "\
usage: cargo xtask softroce [--] CMD [ARGS...]

Runs CMD as root in a throwaway QEMU guest (Debian's kernel, rdma_rxe, rxe0 on a dummy
netdev; host / read-only under a RAM overlay), in the current directory, with the host's
environment plus RDMA_DEV, RDMA_GID_INDEX and RDMA_IP. Exits with CMD's status (125: the
guest never reported one).

Knobs: RXE_VM_CACHE, RXE_VM_ACCEL (auto|kvm|tcg), RXE_VM_MEM (2G), RXE_VM_CPUS,
RXE_VM_TIMEOUT (3000 s), RXE_VM_IP (192.0.2.1), RXE_VM_RW (dirs shared read-write),
RXE_VM_QEMU_CPU (max), RXE_VM_DEBUG=1. See xtask/src/softroce.rs.

Example:
  cargo xtask softroce -- ibv_devinfo";

/// Modules loaded in the guest (their dependencies come from modules.dep). crc32_generic:
/// rdma_rxe allocates the \"crc32\" shash for the ICRC and fails device creation without it
/// (crc32-pclmul needs PCLMULQDQ, absent on some -cpu models).
const MODULES: &[&str] =
    &["virtio_pci", "9pnet_virtio", "9p", "overlay", "crc32_generic", "rdma_rxe", "rdma_ucm", "ib_umad", "dummy", "veth"];

/// Parts of the kernel .deb unpacked (about 100 MB instead of 430).
const KERNEL_PARTS: &[&str] = &[
    "./boot/vmlinuz-*",
    "./boot/config-*",
    "./lib/modules/*/modules.builtin",
    "./lib/modules/*/modules.order",
    "./lib/modules/*/kernel/drivers/infiniband",
    "./lib/modules/*/kernel/drivers/virtio",
    "./lib/modules/*/kernel/drivers/net/dummy.ko",
    "./lib/modules/*/kernel/drivers/net/veth.ko",
    "./lib/modules/*/kernel/net",
    "./lib/modules/*/kernel/fs",
    "./lib/modules/*/kernel/crypto",
    "./lib/modules/*/kernel/lib",
    "./lib/modules/*/kernel/arch",
];

/// The guest's /init (busybox sh). The host writes /ctl/config (DEBUG MODULES VM_IP RW_DIRS
/// TTY), /ctl/env (exported variables) and /ctl/cmd; the guest writes /ctl/ready (uptime when
/// the command starts) and /ctl/rc (its exit status). The command's output goes to the 2nd
/// serial port (the host's stdout), the kernel console to the 1st (a log file).
const INIT: &str = r##"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
echo /bin/modprobe > /proc/sys/kernel/modprobe
fail() { echo "[softroce guest] FAILED: $*" | tee /dev/ttyS1; sync; poweroff -f; }
O=msize=512000,trans=virtio,version=9p2000.L
modprobe virtio_pci; modprobe 9pnet_virtio; modprobe 9p; modprobe overlay
mount -t 9p -o $O,cache=none rxectl /ctl || fail "mount control share"
. /ctl/config
[ "$DEBUG" = 1 ] && set -x
for m in $MODULES; do modprobe $m || fail "modprobe $m"; done
# host root: read-only 9p, made writable (in RAM) by an overlay
mount -t 9p -o $O,ro,cache=loose hostroot /lower || fail "mount host root"
mount -t tmpfs -o mode=0755 tmpfs /upper && mkdir /upper/u /upper/w
mount -t overlay -o lowerdir=/lower,upperdir=/upper/u,workdir=/upper/w overlay /newroot \
    || fail "overlay mount"
N=/newroot
mount -t proc proc $N/proc; mount -t sysfs sysfs $N/sys; mount -t devtmpfs devtmpfs $N/dev
mkdir -p $N/dev/pts $N/dev/shm
mount -t devpts -o ptmxmode=0666 devpts $N/dev/pts; mount -t tmpfs tmpfs $N/dev/shm
mount -t tmpfs tmpfs $N/run      # (/tmp stays the host's /tmp, writable via the overlay)
mkdir -p $N/rxe-vm-ctl && mount -o bind /ctl $N/rxe-vm-ctl
i=0
for d in $RW_DIRS; do
    mkdir -p "$N$d" && mount -t 9p -o $O,cache=none "rw$i" "$N$d" || fail "mount rw share $d"
    i=$((i+1))
done
# network + SoftRoCE
ip link set lo up
ip link add rxe_eth0 type dummy || fail "dummy netdev"
ip addr add $VM_IP/24 dev rxe_eth0; ip link set rxe_eth0 up
chroot $N rdma link add rxe0 type rxe netdev rxe_eth0 || fail "rdma link add"
# GID index of the IPv4-mapped RoCEv2 GID (::ffff:a.b.c.d)
want=$(echo $VM_IP | awk -F. '{printf "0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x", $1,$2,$3,$4}')
GIDX=; t=0
while [ -z "$GIDX" ] && [ $t -lt 100 ]; do
    for gi in 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15; do
        read g < /sys/class/infiniband/rxe0/ports/1/gids/$gi 2>/dev/null
        [ "$g" = "$want" ] && { GIDX=$gi; break; }
    done
    [ -z "$GIDX" ] && { sleep 0.1; t=$((t+1)); }
done
[ -n "$GIDX" ] || fail "no IPv4 GID on rxe0"
echo "export RDMA_DEV=rxe0 RDMA_GID_INDEX=$GIDX RDMA_IP=$VM_IP" >> /ctl/env
stty -onlcr < /dev/ttyS1 2>/dev/null          # no \r\n
cut -d' ' -f1 /proc/uptime > /ctl/ready
run() { chroot $N /bin/bash -c 'ulimit -l unlimited; . /rxe-vm-ctl/env 2>/dev/null; . /rxe-vm-ctl/cmd' < /dev/null; }
if [ "$TTY" = 1 ]; then      # the host's stdout is a terminal: give the command one too
    run > /dev/ttyS1 2>&1; echo $? > /ctl/rc
else                         # else a pipe, as on the host (no colours, no tty line buffering)
    mkfifo /out; cat /out > /dev/ttyS1 & cat=$!
    run > /out 2>&1; echo $? > /ctl/rc
    # processes the command left running may hold the pipe open: give cat 2 s to drain
    t=0; while [ $t -lt 20 ] && ! grep -q '^State:.*[ZX]' /proc/$cat/status 2>/dev/null \
               && [ -e /proc/$cat ]; do sleep 0.1; t=$((t+1)); done
    kill $cat 2>/dev/null
fi
sync
poweroff -f
"##;

/// Bumped when the initramfs layout changes without its inputs changing.
const INITRD_FORMAT: &str = "softroce-initrd-1";

/// An auto-chosen KVM guest that has not started the command after this long is retried
/// under TCG (a KVM boot takes a second or two where KVM works).
const KVM_GRACE: Duration = Duration::from_secs(60);

macro_rules! log {
    ($($a:tt)*) => { eprintln!("[softroce] {}", format_args!($($a)*)) };
}

mod qemu;

/// Entry point: `args` are what follows `softroce` on the command line.
pub fn main(args: &[String]) -> ExitCode {
    let args = match args.first().map(String::as_str) {
        Some("--") => &args[1..],
        _ => args,
    };
    match args.first().map(String::as_str) {
        None => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
        Some("-h" | "--help") => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        _ => {}
    }
    match run(args) {
        Ok(rc) => ExitCode::from(rc),
        Err(e) => {
            log!("error: {e}");
            ExitCode::from(125)
        }
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Accel {
    Kvm,
    Tcg,
}

struct Config {
    cache: PathBuf,
    mem: String,
    cpus: u32,
    timeout: Duration,
    accel: Accel,
    accel_auto: bool,
    ip: Ipv4Addr,
    debug: bool,
    rw: Vec<PathBuf>,
    qemu_cpu: String,
}

fn env_or(name: &str, default: &str) -> String {
    match std::env::var(name) {
        Ok(v) if !v.is_empty() => v,
        _ => default.to_string(),
    }
}

/// The guest's cache: kernel, initramfs, unpacked QEMU (`RXE_VM_CACHE`, else
/// `$XDG_CACHE_HOME/rxe-vm`, else `~/.cache/rxe-vm`).
pub(crate) fn cache_dir() -> Result<PathBuf, String> {
    crate::util::cache_dir("RXE_VM_CACHE", "rxe-vm")
}

impl Config {
    fn from_env() -> Result<Config, String> {
        let cache = cache_dir()?;
        let host_cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).to_string();
        let cpus = env_or("RXE_VM_CPUS", &host_cpus);
        let cpus: u32 = cpus.parse().ok().filter(|&n| n > 0).ok_or(format!("RXE_VM_CPUS={cpus}: not a positive number"))?;
        let timeout = env_or("RXE_VM_TIMEOUT", "3000");
        let timeout: u64 =
            timeout.parse().ok().filter(|&n| n > 0).ok_or(format!("RXE_VM_TIMEOUT={timeout}: not a positive number of seconds"))?;
        let ip = env_or("RXE_VM_IP", "192.0.2.1");
        let ip: Ipv4Addr = ip.parse().map_err(|_| format!("RXE_VM_IP={ip}: not an IPv4 address"))?;
        let (accel, accel_auto) = match env_or("RXE_VM_ACCEL", "auto").as_str() {
            "auto" => (if kvm_usable() { Accel::Kvm } else { Accel::Tcg }, true),
            "kvm" => (Accel::Kvm, false),
            "tcg" => (Accel::Tcg, false),
            other => return Err(format!("RXE_VM_ACCEL={other}: must be auto, kvm or tcg")),
        };
        let mut rw = Vec::new();
        for d in env_or("RXE_VM_RW", "").split_whitespace() {
            let p = fs::canonicalize(d).map_err(|e| format!("RXE_VM_RW: {d}: {e}"))?;
            if !p.is_dir() {
                return Err(format!("RXE_VM_RW: {} is not a directory", p.display()));
            }
            if p.as_os_str().as_bytes().iter().any(|b| b.is_ascii_whitespace() || b"\"'$`\\".contains(b)) {
                return Err(format!("RXE_VM_RW: {}: blanks, quotes, $, ` and \\ are not supported in these paths", p.display()));
            }
            rw.push(p);
        }
        Ok(Config {
            cache,
            mem: env_or("RXE_VM_MEM", "2G"),
            cpus,
            timeout: Duration::from_secs(timeout),
            accel,
            accel_auto,
            ip,
            debug: env_or("RXE_VM_DEBUG", "0") == "1",
            rw,
            qemu_cpu: env_or("RXE_VM_QEMU_CPU", "max"),
        })
    }
}

/// KVM only if /dev/kvm opens read-write and the CPU shows hardware virtualisation.
fn kvm_usable() -> bool {
    let dev = OpenOptions::new().read(true).write(true).open("/dev/kvm").is_ok();
    let cpu = fs::read_to_string("/proc/cpuinfo")
        .map(|s| s.lines().filter(|l| l.starts_with("flags")).any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm")))
        .unwrap_or(false);
    dev && cpu
}

pub(crate) fn run(cmd: &[String]) -> Result<u8, String> {
    let t0 = Instant::now();
    let cfg = Config::from_env()?;
    crate::prereq::ensure_group(crate::prereq::Group::Softroce)?;
    let busybox = busybox_path()?;

    fs::create_dir_all(&cfg.cache).map_err(|e| format!("cache dir {}: {e}", cfg.cache.display()))?;
    // One builder at a time (flock, as the shell script); the guests themselves run in parallel.
    let lock_path = cfg.cache.join(".lock");
    let lock = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(false)
        .open(&lock_path)
        .map_err(|e| format!("{}: {e}", lock_path.display()))?;
    lock.lock().map_err(|e| format!("lock {}: {e}", lock_path.display()))?;
    let qemu = qemu::ensure(&cfg.cache)?;
    let kernel = ensure_kernel(&cfg.cache, &busybox)?;
    let (initrd, guest_modules) = ensure_initrd(&cfg.cache, &kernel, &busybox)?;
    drop(lock);

    let run = TempDir::create("run")?;
    write_run_files(&run.0, &cfg, &guest_modules, cmd)?;
    let setup = t0.elapsed();

    let mut accel = cfg.accel;
    let outcome = loop {
        let t = Instant::now();
        let o = boot(&cfg, &qemu, accel, &kernel, &initrd, &run.0)?;
        match o {
            Boot::NotUp(why) if accel == Accel::Kvm && cfg.accel_auto => {
                log!("the KVM guest {why}: retrying under TCG (RXE_VM_ACCEL=tcg skips KVM)");
                for f in ["ready", "rc", "console.log"] {
                    let _ = fs::remove_file(run.0.join(f));
                }
                // (env may have got the guest's RDMA_* line already: the retry appends the same)
                accel = Accel::Tcg;
            }
            o => break (o, t.elapsed()),
        }
    };
    let (outcome, vm_time) = outcome;
    let console = run.0.join("console.log");
    let rc = fs::read_to_string(run.0.join("rc")).ok().and_then(|s| s.trim().parse::<u8>().ok());
    match (rc, outcome) {
        (Some(rc), _) => {
            if cfg.debug {
                log!("guest console:");
                let _ = std::io::stderr().write_all(&fs::read(&console).unwrap_or_default());
            }
            let ready = fs::read_to_string(run.0.join("ready")).unwrap_or_default();
            log!(
                "command exit status: {rc} (guest ready after {} s of guest uptime; set-up {:.1} s, guest {:.1} s, {:.1} s in all)",
                ready.trim(),
                setup.as_secs_f64(),
                vm_time.as_secs_f64(),
                t0.elapsed().as_secs_f64()
            );
            Ok(rc)
        }
        (None, o) => {
            let why = match o {
                Boot::TimedOut => format!("killed after RXE_VM_TIMEOUT={} s", cfg.timeout.as_secs()),
                _ => "boot failure or crash".to_string(),
            };
            log!("the guest ended without reporting an exit status ({why}; RXE_VM_DEBUG=1 shows more); guest console:");
            let text = String::from_utf8_lossy(&fs::read(&console).unwrap_or_default()).into_owned();
            let lines: Vec<&str> = text.lines().collect();
            for l in &lines[lines.len().saturating_sub(60)..] {
                eprintln!("{l}");
            }
            Ok(125)
        }
    }
}

// ------------------------------------------------------------------------- host set-up

/// The static busybox of the busybox-static package.
fn busybox_path() -> Result<PathBuf, String> {
    let out = output(Command::new("dpkg").args(["-L", "busybox-static"]), "dpkg -L busybox-static")?;
    out.lines()
        .find(|l| l.ends_with("/bin/busybox") || l.ends_with("/sbin/busybox"))
        .map(PathBuf::from)
        .ok_or_else(|| "busybox-static ships no bin/busybox?".to_string())
}

/// Runs `cmd`; its stdout, or an error with its stderr.
fn output(cmd: &mut Command, what: &str) -> Result<String, String> {
    let o = cmd.output().map_err(|e| format!("{what}: {e}"))?;
    if !o.status.success() {
        return Err(format!("{what} failed ({}): {}", o.status, String::from_utf8_lossy(&o.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// Runs `cmd` with its stdout on stderr; an error if it fails.
fn status(cmd: &mut Command, what: &str) -> Result<(), String> {
    let st = cmd.stdout(Stdio::from(std::io::stderr())).status().map_err(|e| format!("{what}: {e}"))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("{what} failed ({st})"))
    }
}

// ------------------------------------------------------------------------- kernel

struct Kernel {
    kver: String,
    image: PathBuf,
    moddir: PathBuf,
}

/// The kernel image package linux-image-amd64 points at (e.g. linux-image-6.1.0-35-amd64).
fn kernel_package() -> Option<String> {
    let out = Command::new("apt-cache").args(["depends", "linux-image-amd64"]).stderr(Stdio::null()).output().ok()?;
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let dep = l.trim().trim_start_matches('|').strip_prefix("Depends: ")?.trim();
        let rest = dep.strip_prefix("linux-image-")?;
        rest.starts_with(|c: char| c.is_ascii_digit()).then(|| dep.split_whitespace().next().unwrap_or(dep).to_string())
    })
}

/// Kernel + modules in `cache` (the shell script's layout: kver, kernel/boot, kernel/lib/modules).
fn ensure_kernel(cache: &Path, busybox: &Path) -> Result<Kernel, String> {
    let kver_file = cache.join("kver");
    let kdir = cache.join("kernel");
    if !kver_file.exists() {
        let _ = fs::remove_dir_all(&kdir);
        // In the temp dir, open to apt's _apt user (a home dir is not: a warning and an
        // unsandboxed download as root); removed on drop.
        let dl_dir = TempDir::create("dl")?;
        let dl = &dl_dir.0;
        let _ = fs::set_permissions(dl, fs::Permissions::from_mode(0o777));
        let download =
            |pkg: &str| status(Command::new("apt-get").args(["download", "-q", pkg]).current_dir(dl), &format!("apt-get download {pkg}"));
        let pkg = kernel_package();
        log!("downloading {}", pkg.as_deref().unwrap_or("the kernel of linux-image-amd64"));
        let pkg = match pkg {
            Some(p) if download(&p).is_ok() => p,
            _ => {
                // stale or missing package lists
                status(Command::new("apt-get").args(["update", "-qq"]).stdout(Stdio::from(std::io::stderr())), "apt-get update")?;
                let p = kernel_package().ok_or("cannot resolve linux-image-amd64 (apt-cache depends linux-image-amd64)")?;
                download(&p)?;
                p
            }
        };
        let deb = fs::read_dir(dl)
            .map_err(|e| format!("{}: {e}", dl.display()))?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&format!("{pkg}_")) && n.to_string_lossy().ends_with(".deb"))
            })
            .ok_or(format!("apt-get download {pkg} left no .deb"))?;
        fs::create_dir_all(&kdir).map_err(|e| format!("{}: {e}", kdir.display()))?;
        // dpkg-deb --fsys-tarfile DEB | tar -x -C kernel --wildcards -f - PARTS...
        let mut dpkg = Command::new("dpkg-deb")
            .arg("--fsys-tarfile")
            .arg(&deb)
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("dpkg-deb: {e}"))?;
        let tar_in = dpkg.stdout.take().ok_or("dpkg-deb: no stdout")?;
        let tar = Command::new("tar")
            .arg("-x")
            .arg("-C")
            .arg(&kdir)
            .args(["--wildcards", "-f", "-"])
            .args(KERNEL_PARTS)
            .stdin(Stdio::from(tar_in))
            .status()
            .map_err(|e| format!("tar: {e}"));
        let dst = dpkg.wait().map_err(|e| format!("dpkg-deb: {e}"))?;
        let tst = tar?;
        if !dst.success() || !tst.success() {
            return Err(format!("unpacking {} failed (dpkg-deb {dst}, tar {tst})", deb.display()));
        }
        drop(dl_dir);
        let kvers: Vec<String> = fs::read_dir(kdir.join("lib/modules"))
            .map_err(|e| format!("{}/lib/modules: {e}", kdir.display()))?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        let [kver] = kvers.as_slice() else {
            return Err(format!("expected one kernel version in the .deb, found {kvers:?}"));
        };
        // the .deb ships no modules.dep
        status(Command::new(busybox).arg("depmod").arg("-b").arg(&kdir).arg(kver), "busybox depmod")?;
        extract_vmlinux(&kdir.join(format!("boot/vmlinuz-{kver}")), &kdir.join(format!("boot/vmlinux-{kver}")));
        fs::write(&kver_file, format!("{kver}\n")).map_err(|e| format!("{}: {e}", kver_file.display()))?;
    }
    let kver = fs::read_to_string(&kver_file).map_err(|e| format!("{}: {e}", kver_file.display()))?.trim().to_string();
    let vmlinux = kdir.join(format!("boot/vmlinux-{kver}"));
    let image = if vmlinux.exists() { vmlinux } else { kdir.join(format!("boot/vmlinuz-{kver}")) };
    if !image.exists() {
        return Err(format!("{} is missing: remove {} to fetch the kernel again", image.display(), kver_file.display()));
    }
    let moddir = kdir.join("lib/modules").join(&kver);
    Ok(Kernel { kver, image, moddir })
}

/// Uncompressed vmlinux from the bzImage's xz payload, booted through its PVH entry point:
/// skips the xz decompression that takes ~6 s under TCG. Leaves nothing when that fails (the
/// bzImage is then booted).
fn extract_vmlinux(bz: &Path, out: &Path) {
    let Ok(img) = fs::read(bz) else { return };
    let magic = b"\xfd7zXZ\x00";
    let Some(pos) = img.windows(magic.len()).position(|w| w == magic) else { return };
    let tmp = out.with_extension("tmp");
    let ok = (|| -> Option<()> {
        let f = File::create(&tmp).ok()?;
        let mut xz =
            Command::new("xz").args(["-dc", "--single-stream"]).stdin(Stdio::piped()).stdout(f).stderr(Stdio::null()).spawn().ok()?;
        let mut stdin = xz.stdin.take()?;
        let _ = stdin.write_all(&img[pos..]); // xz may stop reading after the stream: fine
        drop(stdin);
        if !xz.wait().ok()?.success() {
            return None;
        }
        elf_complete(&fs::read(&tmp).ok()?).then_some(())
    })();
    match ok {
        Some(()) => {
            let _ = fs::rename(&tmp, out);
        }
        None => {
            let _ = fs::remove_file(&tmp);
        }
    }
}

/// A 64-bit little-endian ELF whose program segments and section headers lie inside it.
fn elf_complete(b: &[u8]) -> bool {
    let u16_at = |o: usize| b.get(o..o + 2).map(|s| u16::from_le_bytes([s[0], s[1]]) as u64);
    let u64_at = |o: usize| b.get(o..o + 8).map(|s| u64::from_le_bytes(s.try_into().unwrap()));
    if b.len() < 64 || &b[..4] != b"\x7fELF" || b[4] != 2 || b[5] != 1 {
        return false;
    }
    let len = b.len() as u64;
    let (Some(phoff), Some(phentsize), Some(phnum), Some(shoff), Some(shentsize), Some(shnum)) =
        (u64_at(0x20), u16_at(0x36), u16_at(0x38), u64_at(0x28), u16_at(0x3a), u16_at(0x3c))
    else {
        return false;
    };
    if phoff + phentsize * phnum > len || shoff + shentsize * shnum > len {
        return false;
    }
    (0..phnum).all(|i| {
        let p = (phoff + i * phentsize) as usize;
        match (u64_at(p + 0x08), u64_at(p + 0x20)) {
            (Some(off), Some(filesz)) => off + filesz <= len,
            _ => false,
        }
    })
}

// ------------------------------------------------------------------------- initramfs

/// The initramfs for `k` (built when missing) and the modules the guest loads.
fn ensure_initrd(cache: &Path, k: &Kernel, busybox: &Path) -> Result<(PathBuf, Vec<String>), String> {
    let dep_path = k.moddir.join("modules.dep");
    let dep_text = fs::read_to_string(&dep_path).map_err(|e| format!("{}: {e}", dep_path.display()))?;
    let deps: BTreeMap<&str, Vec<&str>> =
        dep_text.lines().filter_map(|l| l.split_once(':')).map(|(m, d)| (m.trim(), d.split_whitespace().collect())).collect();
    let builtin = fs::read_to_string(k.moddir.join("modules.builtin")).unwrap_or_default();
    let mut wanted = Vec::new(); // modules.dep keys of MODULES
    let mut guest_modules = Vec::new();
    for m in MODULES {
        let is = |p: &str| {
            let name = p.rsplit('/').next().unwrap_or(p);
            name.strip_prefix(m).and_then(|r| r.strip_prefix(".ko")).is_some_and(|r| r.is_empty() || r.starts_with('.'))
        };
        if let Some(p) = deps.keys().find(|p| is(p)) {
            wanted.push(*p);
            guest_modules.push(m.to_string());
        } else if !builtin.lines().any(is) {
            return Err(format!("module {m} is neither in {} nor built in", dep_path.display()));
        }
    }
    let bb = fs::read(busybox).map_err(|e| format!("{}: {e}", busybox.display()))?;
    let mut h = Fnv::default();
    for part in [INITRD_FORMAT.as_bytes(), INIT.as_bytes(), k.kver.as_bytes(), dep_text.as_bytes(), &bb] {
        h.write(part);
    }
    for m in &wanted {
        h.write(m.as_bytes());
    }
    let initrd = cache.join(format!("initrd-{}-{:016x}.cpio", k.kver, h.0));
    if initrd.exists() {
        return Ok((initrd, guest_modules));
    }
    log!("building the initramfs for {}", k.kver);

    let mut seen = BTreeSet::new();
    fn add<'a>(m: &'a str, deps: &BTreeMap<&'a str, Vec<&'a str>>, seen: &mut BTreeSet<&'a str>) -> Result<(), String> {
        if !seen.insert(m) {
            return Ok(());
        }
        for d in deps.get(m).ok_or(format!("no {m} in modules.dep"))? {
            add(d, deps, seen)?;
        }
        Ok(())
    }
    for m in &wanted {
        add(m, &deps, &mut seen)?;
    }
    let modroot = format!("lib/modules/{}", k.kver);
    let mut dirs: BTreeSet<String> =
        ["bin", "dev", "proc", "sys", "ctl", "lower", "upper", "newroot", "lib", "lib/modules"].iter().map(|s| s.to_string()).collect();
    let mut files: Vec<(String, Vec<u8>, u32)> = vec![("bin/busybox".into(), bb, 0o755), ("init".into(), INIT.as_bytes().to_vec(), 0o755)];
    for m in &seen {
        let data = fs::read(k.moddir.join(m)).map_err(|e| format!("{}/{m}: {e}", k.moddir.display()))?;
        files.push((format!("{modroot}/{m}"), data, 0o644));
    }
    let subset: String =
        dep_text.lines().filter(|l| l.split_once(':').is_some_and(|(m, _)| seen.contains(m.trim()))).map(|l| format!("{l}\n")).collect();
    files.push((format!("{modroot}/modules.dep"), subset.into_bytes(), 0o644));
    for f in ["modules.alias", "modules.builtin"] {
        if let Ok(d) = fs::read(k.moddir.join(f)) {
            files.push((format!("{modroot}/{f}"), d, 0o644));
        }
    }
    for (path, _, _) in &files {
        let mut p = Path::new(path).parent();
        while let Some(d) = p.filter(|d| !d.as_os_str().is_empty()) {
            dirs.insert(d.to_string_lossy().into_owned());
            p = d.parent();
        }
    }
    // Uncompressed: nothing to inflate in the guest (the kernel takes a plain newc archive).
    let mut cpio = Cpio::default();
    for d in &dirs {
        cpio.entry(d, 0o040755, 2, (0, 0), &[]);
    }
    cpio.entry("dev/console", 0o020600, 1, (5, 1), &[]);
    for (path, data, mode) in &files {
        cpio.entry(path, 0o100000 | mode, 1, (0, 0), data);
    }
    cpio.entry("TRAILER!!!", 0, 1, (0, 0), &[]);
    let tmp = initrd.with_extension("tmp");
    fs::write(&tmp, &cpio.buf).and_then(|()| fs::rename(&tmp, &initrd)).map_err(|e| format!("{}: {e}", initrd.display()))?;
    Ok((initrd, guest_modules))
}

/// A cpio archive in the "newc" format the kernel unpacks.
#[derive(Default)]
struct Cpio {
    buf: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, nlink: u32, rdev: (u32, u32), data: &[u8]) {
        self.ino += 1;
        let fields = [self.ino, mode, 0, 0, nlink, 0, data.len() as u32, 0, 0, rdev.0, rdev.1, name.len() as u32 + 1, 0];
        self.buf.extend_from_slice(b"070701");
        for f in fields {
            self.buf.extend_from_slice(format!("{f:08X}").as_bytes());
        }
        self.buf.extend_from_slice(name.as_bytes());
        self.buf.push(0);
        self.pad();
        self.buf.extend_from_slice(data);
        self.pad();
    }
    fn pad(&mut self) {
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
    }
}

/// FNV-1a, 64 bits: a stable key for the cached initramfs.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn write(&mut self, b: &[u8]) {
        for &x in b {
            self.0 = (self.0 ^ x as u64).wrapping_mul(0x100_0000_01b3);
        }
        self.0 = (self.0 ^ 0xff).wrapping_mul(0x100_0000_01b3); // separator
    }
}

// ------------------------------------------------------------------------- one run

/// A directory in the temp dir (the control directory shared with the guest, the kernel
/// download); removed on drop. Those of processes that are gone (killed by a signal) are
/// removed by the next run.
struct TempDir(PathBuf);

impl TempDir {
    fn create(tag: &str) -> Result<TempDir, String> {
        let tmp = std::env::temp_dir();
        let prefix = "xtask-softroce.";
        if let Ok(rd) = fs::read_dir(&tmp) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(pid) = name.strip_prefix(prefix).and_then(|r| r.split('.').next()).and_then(|p| p.parse::<u32>().ok()) {
                    if !Path::new(&format!("/proc/{pid}")).exists() {
                        let _ = fs::remove_dir_all(e.path());
                    }
                }
            }
        }
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
        let dir = tmp.join(format!("{prefix}{}.{tag}.{nanos}", std::process::id()));
        fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(TempDir(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// `'...'` quoting for sh, byte for byte.
fn sh_quote(s: &OsStr) -> Vec<u8> {
    let mut q = vec![b'\''];
    for &b in s.as_bytes() {
        if b == b'\'' {
            q.extend_from_slice(b"'\\''");
        } else {
            q.push(b);
        }
    }
    q.push(b'\'');
    q
}

/// Variables not passed to the guest: the shell's own, bash's read-only ones, and those cargo
/// sets for the xtask binary itself.
fn skip_var(name: &str) -> bool {
    const SHELL: &[&str] = &["PWD", "OLDPWD", "SHLVL", "_", "BASHOPTS", "BASH_VERSINFO", "EUID", "PPID", "SHELLOPTS", "UID"];
    const CARGO_RUN: &[&str] = &[
        "CARGO_MANIFEST_DIR",
        "CARGO_MANIFEST_PATH",
        "CARGO_CRATE_NAME",
        "CARGO_BIN_NAME",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_MANIFEST_LINKS",
    ];
    let ident =
        !name.is_empty() && !name.starts_with(|c: char| c.is_ascii_digit()) && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    !ident || SHELL.contains(&name) || CARGO_RUN.contains(&name) || name.starts_with("CARGO_PKG_")
}

fn write_run_files(dir: &Path, cfg: &Config, modules: &[String], cmd: &[String]) -> Result<(), String> {
    let w = |name: &str, data: &[u8]| fs::write(dir.join(name), data).map_err(|e| format!("{}/{name}: {e}", dir.display()));
    let rw: Vec<String> = cfg.rw.iter().map(|p| p.display().to_string()).collect();
    let config = format!(
        "DEBUG={}\nMODULES=\"{}\"\nVM_IP={}\nRW_DIRS=\"{}\"\nTTY={}\n",
        cfg.debug as u8,
        modules.join(" "),
        cfg.ip,
        rw.join(" "),
        std::io::stdout().is_terminal() as u8
    );
    w("config", config.as_bytes())?;
    let mut env = Vec::new();
    for (k, v) in std::env::vars_os() {
        let Some(name) = k.to_str() else { continue };
        if skip_var(name) {
            continue;
        }
        env.extend_from_slice(format!("export {name}=").as_bytes());
        env.extend_from_slice(&sh_quote(&v));
        env.push(b'\n');
    }
    w("env", &env)?;
    // The host's logical current directory ($PWD) when it is the real one, as a shell would.
    let cwd = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
    let cwd = match std::env::var_os("PWD").map(PathBuf::from) {
        Some(p) if p.is_absolute() && fs::canonicalize(&p).ok() == fs::canonicalize(&cwd).ok() => p,
        _ => cwd,
    };
    let mut c = b"cd ".to_vec();
    c.extend_from_slice(&sh_quote(cwd.as_os_str()));
    c.extend_from_slice(b" || exit 125\nexec");
    for a in cmd {
        c.push(b' ');
        c.extend_from_slice(&sh_quote(OsStr::new(a)));
    }
    c.push(b'\n');
    w("cmd", &c)
}

enum Boot {
    /// QEMU exited (the command may or may not have reported).
    Exited,
    /// Killed after RXE_VM_TIMEOUT.
    TimedOut,
    /// Auto-chosen KVM: QEMU ended, or was killed after KVM_GRACE, before the command started.
    NotUp(String),
}

/// A comma in a QEMU option value is written twice.
fn qemu_opt(p: &Path) -> String {
    p.display().to_string().replace(',', ",,")
}

fn boot(cfg: &Config, q: &qemu::Qemu, accel: Accel, k: &Kernel, initrd: &Path, run: &Path) -> Result<Boot, String> {
    let qemu = q.program.display().to_string();
    // setpriv --pdeathsig: QEMU dies with this process (signals, kills), as the script's trap.
    let mut cmd = q.command(crate::util::have("setpriv"));
    match accel {
        Accel::Kvm => cmd.args(["-accel", "kvm", "-cpu", "host"]),
        Accel::Tcg => cmd.args(["-accel", "tcg,thread=multi", "-cpu", &cfg.qemu_cpu]),
    };
    let mut append = "console=ttyS0 panic=-1 mitigations=off edd=off".to_string();
    if !cfg.debug {
        append.push_str(" quiet");
    }
    cmd.args(["-m", &cfg.mem, "-smp", &cfg.cpus.to_string()])
        .args(["-nodefaults", "-no-user-config", "-nographic", "-no-reboot"])
        .args(["-serial", &format!("file:{}", qemu_opt(&run.join("console.log"))), "-serial", "stdio", "-monitor", "none"])
        .arg("-kernel")
        .arg(&k.image)
        .arg("-initrd")
        .arg(initrd)
        .args(["-append", &append])
        .args(["-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap"])
        .args(["-virtfs", &format!("local,path={},mount_tag=rxectl,security_model=none", qemu_opt(run))]);
    for (i, d) in cfg.rw.iter().enumerate() {
        cmd.args(["-virtfs", &format!("local,path={},mount_tag=rw{i},security_model=none,multidevs=remap", qemu_opt(d))]);
    }
    cmd.args(["-nic", "none"]).stdin(Stdio::null());
    log!("booting {} ({}, {} vCPU, {})", k.kver, if accel == Accel::Kvm { "kvm" } else { "tcg" }, cfg.cpus, cfg.mem);
    let mut child: Child = cmd.spawn().map_err(|e| format!("{qemu}: {e}"))?;
    let t = Instant::now();
    let ready = run.join("ready");
    let watch_up = accel == Accel::Kvm && cfg.accel_auto;
    loop {
        if child.try_wait().map_err(|e| format!("{qemu}: {e}"))?.is_some() {
            if watch_up && !ready.exists() {
                return Ok(Boot::NotUp("ended before the command started".into()));
            }
            return Ok(Boot::Exited);
        }
        let up_late = watch_up && t.elapsed() > KVM_GRACE && !ready.exists();
        if up_late || t.elapsed() > cfg.timeout {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(if up_late {
                Boot::NotUp(format!("had not started the command after {} s", KVM_GRACE.as_secs()))
            } else {
                Boot::TimedOut
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(sh_quote(OsStr::new("a b")), b"'a b'");
        assert_eq!(sh_quote(OsStr::new("it's")), b"'it'\\''s'");
    }

    #[test]
    fn cpio_layout() {
        let mut c = Cpio::default();
        c.entry("init", 0o100755, 1, (0, 0), b"abc");
        assert_eq!(&c.buf[..6], b"070701");
        assert_eq!(c.buf.len() % 4, 0);
        // header 110 + "init\0" = 115 -> 116, + 3 data -> 119 -> 120
        assert_eq!(c.buf.len(), 120);
    }

    #[test]
    fn skipped_vars() {
        assert!(skip_var("PWD") && skip_var("CARGO_PKG_NAME") && skip_var("A-B") && skip_var("1X"));
        assert!(!skip_var("PATH") && !skip_var("CARGO") && !skip_var("RUST_LOG"));
    }
}
