# Shared by the device scripts (gpu_session.sh, gpu_kernels_session.sh); source it after setting
# OUT (an existing folder). install_wheels DIR: pip-install DIR/*.whl into /tmp/site (the lent
# machines reach no registry); gpu_env: device, driver, clocks and versions into $OUT/env.txt;
# step NAME SECONDS COMMAND...: run COMMAND with its own time limit, its output in
# $OUT/logs/NAME.log, one line of exit status and time appended to env.txt.
mkdir -p "$OUT/logs"
export PYTHONUNBUFFERED=1
install_wheels() {
    if ls "$1"/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site "$1"/*.whl && export PYTHONPATH=/tmp/site
    fi
}
gpu_env() {
    {
        date -u
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw \
            --format=csv
        python3 -c "import torch, triton; p = torch.cuda.get_device_properties(0); \
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, \
'nccl', torch.cuda.nccl.version()); print(p.name, p.multi_processor_count, 'SMs', \
round(p.total_memory / 2**30, 1), 'GiB')"
    } > "$OUT/env.txt" 2>&1
}
step() {  # step NAME SECONDS COMMAND...
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" > "$OUT/logs/$name.log" 2>&1
    echo "step $name: exit $? in $((SECONDS - t0)) s" | tee -a "$OUT/env.txt"
}
