//===- Passes.td - Parallelisation passes ---------------------*- tablegen -*-===//

#ifndef TESSERA_DIALECTS_DIST_TRANSFORMS_PASSES_TD
#define TESSERA_DIALECTS_DIST_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

def AttachMeshPass : Pass<"tessera-attach-mesh", "mlir::ModuleOp"> {
  let summary = "attach the device mesh and check the model against it";
  let description = [{
    Adds `dist.mesh @mesh` with the given sizes and checks the configuration:
    valid sizes and order string, an integral expert data-parallel size
    (ep * etp divides tp * cp * dp), and every dimension that tp-partition
    will split divisible by tp (an error names the op and the sizes).
  }];
  let dependentDialects = ["::tessera::dist::DistDialect"];
  let options = [
    Option<"tp", "tp", "int64_t", "1", "tensor-parallel size">,
    Option<"cp", "cp", "int64_t", "1", "context-parallel size">,
    Option<"ep", "ep", "int64_t", "1", "expert-parallel size">,
    Option<"etp", "etp", "int64_t", "0",
           "expert tensor-parallel size (0: tp, as Megatron's "
           "--expert-tensor-parallel-size)">,
    Option<"dp", "dp", "int64_t", "1", "data-parallel size">,
    Option<"pp", "pp", "int64_t", "1", "pipeline-parallel size">,
    Option<"vpp", "vpp", "int64_t", "1", "virtual pipeline chunks per pp rank">,
    Option<"order", "order", "std::string", "\"tp-cp-ep-dp-pp\"",
           "rank order, fastest varying axis first">
  ];
}

def SetBatchPass : Pass<"tessera-set-batch", "mlir::ModuleOp"> {
  let summary = "fix the batch dimension and the microbatch count (Megatron semantics)";
  let description = [{
    `micro-batch-size` is per data-parallel rank, `global-batch-size` the
    whole step over all dp ranks; a step runs global / (micro x dp)
    microbatches. Sets the model inputs' batch dimension to the micro-batch
    size, re-infers every result type and records `tessera.batch` on the
    module. 0 means: take the micro batch from the model's static batch
    dimension and the global batch as micro x dp.
  }];
  let options = [
    Option<"microBatchSize", "micro-batch-size", "int64_t", "0",
           "samples per microbatch per data-parallel rank">,
    Option<"globalBatchSize", "global-batch-size", "int64_t", "0",
           "samples per training step over all data-parallel ranks">
  ];
}

def PadVocabPass : Pass<"tessera-pad-vocab", "mlir::ModuleOp"> {
  let summary = "pad the vocabulary to a multiple of divisible-by x tp (Megatron)";
  let description = [{
    Megatron pads the vocabulary so that it splits evenly over tensor-parallel
    ranks into shards of a friendly size: the padded size is the vocabulary
    rounded up to a multiple of `make-vocab-size-divisible-by` times tp.
    The word-embedding tables and the LM-head weight (the linear producing
    the cross-entropy logits in a model with an embedding) grow to the
    padded size; ids never reach the padding rows, whose logits take part
    in the softmax like any other (as in Megatron). Records
    `tessera.vocab = {size, padded}` on the module.

    With `mask-padding` the padded rows' logits are kept out of the loss
    instead: an `nn.mask_columns` before each cross-entropy sets them to
    the lowest f32 (probability 0, gradient 0), so the padded model is the
    unpadded one at every tp (`masked` in `tessera.vocab`).
    `mask-padding=auto` (the default) masks when the vocabulary's weights
    came with the model (`tessera.init = "data"`: an ONNX or Hugging Face
    import, whose loss must stay the exported model's), and keeps
    Megatron's behaviour for models initialised here.
  }];
  let options = [
    Option<"divisibleBy", "make-vocab-size-divisible-by", "int64_t", "128",
           "pad the vocabulary to a multiple of this times tp">,
    Option<"maskPadding", "mask-padding", "std::string", "\"auto\"",
           "keep the padded rows' logits out of the loss: true, false or "
           "auto (true for imported weights)">
  ];
}

def TPPartitionPass : Pass<"tessera-tp-partition", "mlir::ModuleOp"> {
  let summary = "split linear pairs column/row-parallel over the tp axis";
  let description = [{
    Megatron's ColumnParallelLinear / RowParallelLinear pairing (its MLP
    and attention): a linear whose output reaches another linear through
    elementwise ops becomes column-parallel (weight and bias split along
    out-features, input entering the region through `dist.copy_to_region`)
    and the second row-parallel (weight split along in-features, result
    leaving through `dist.reduce_from_region`, bias added after the
    reduction). Parameters get local shapes and a `dist.sharding`
    attribute. Other linears stay replicated. In a model with an embedding
    the vocabulary is split as well (embedding, LM head, cross-entropy).
    With `sequence-parallel`, the activations between regions live on
    sequence shards: an all-gather along the sequence replaces each
    region's entry and a reduce-scatter its exit, the embeddings are
    scattered onto sequence shards, and the parameters of the layer norms
    and biases that run on shards enter through `dist.copy_to_region`, so
    their gradients are all-reduced.
  }];
  let dependentDialects = ["::tessera::dist::DistDialect", "::tessera::nn::NNDialect"];
  let options = [
    Option<"sequenceParallel", "sequence-parallel", "bool", "false",
           "Megatron sequence parallelism: activations outside the tensor-"
           "parallel regions (layer norms, residuals) on sequence shards; "
           "all-gather before and reduce-scatter after each region">
  ];
  let statistics = [
    Statistic<"numColumn", "column-parallel", "linears split column-parallel">,
    Statistic<"numRow", "row-parallel", "linears split row-parallel">
  ];
}

def CPPartitionPass : Pass<"tessera-cp-partition", "mlir::ModuleOp"> {
  let summary = "split the sequence over the cp axis (context parallelism)";
  let description = [{
    Megatron's context parallelism. Every rank of a cp group holds its
    share of each sample's sequence in the load-balanced causal layout
    (chunks r and 2 cp - 1 - r of 2 cp, Megatron's
    get_batch_on_this_cp_rank): the token and label inputs shrink to
    `seq / cp` rows and carry `dist.sharding = {axis = "cp", dim = 0}`, and
    every activation follows. Attention becomes `dist.ring_attention` over
    "cp" (keys and values around the ring, online softmax); the position
    embedding and dropout take the rows' global positions
    (`sequence_shard_group` "cp", or "tp-cp" on sequence-parallel shards);
    the token mean divides by the whole sequence's count (`nn.token_count`,
    summed over cp) and the cp ranks' shares are summed with
    `dist.reduce_from_region`, whose adjoint leaves each rank the gradient
    of its own tokens. tessera-dp-grad-allreduce then reduces the
    gradients over "dp-cp". Runs after tessera-tp-partition; nothing with
    cp = 1.
  }];
  let dependentDialects = ["::tessera::dist::DistDialect", "::tessera::nn::NNDialect"];
}

def EPPartitionPass : Pass<"tessera-ep-partition", "mlir::ModuleOp"> {
  let summary = "split each MoE layer's experts over ep and their FFN over etp (expert parallelism)";
  let description = [{
    Megatron's expert parallelism with its all-to-all token dispatcher
    (MoEAlltoAllTokenDispatcher, dropless): each MoE layer's E experts are
    split evenly over the ep group (rank j holds experts [j E / ep,
    (j + 1) E / ep); their weights get local shapes and
    `dist.sharding = {axis = "ep", dim = 0}`), `dist.expert_dispatch` sends
    the permuted rows to their experts' ranks after nn.moe_dispatch, and
    `dist.expert_combine` brings the experts' outputs back before
    nn.moe_combine. With expert tensor parallelism (etp > 1) each expert's
    FFN is split over etp too (the first grouped linear's weight on dim 1,
    the second's on dim 2: a second split, `axis2 = "etp"`), and the
    exchange runs over "etp-ep" with `etp`: every etp rank of an expert
    gets its rows, and the partial outputs are summed on the way back.
    tessera-dp-grad-allreduce then puts the experts' gradients in buffers
    of their own, reduced over "edp". Runs after tessera-cp-partition;
    nothing with ep = etp = 1. Errors: experts not divisible by ep, an etp
    that does not divide the expert FFN, a model without MoE layers, ep or
    etp with tp but without sequence parallelism (every tp rank would send
    the same tokens), an expert MLP other than grouped linears between the
    permutation and the combine (two with etp).
  }];
  let dependentDialects = ["::tessera::dist::DistDialect", "::tessera::nn::NNDialect"];
}

def DPGradAllReducePass : Pass<"tessera-dp-grad-allreduce", "mlir::ModuleOp"> {
  let summary = "average gradients over the data-parallel group, bucket by bucket";
  let description = [{
    Lays out Megatron's param-and-grad buffers (`_ParamAndGradBuffer` in
    megatron/core/distributed/param_and_grad_buffer.py; `dist.grad_buffer`
    per model chunk and dtype: reverse order, buckets of `bucket-size`
    elements, with the distributed optimizer 64-element starts and
    lcm(dp, 128) bucket padding, the shared embedding in a bucket of its
    own, one bucket on later pipeline stages) and creates the `step`
    function (`tessera.phase = "step"`) that takes the accumulated
    gradients. Per bucket, the gradients are packed into the flat bucket,
    scaled by 1/dp (Megatron's gradient_scaling_factor) and all-reduced over
    the dp group, or, with `distributed-optimizer`, reduce-scattered: the
    step then returns each bucket's shard (`tessera.grad_shard`) for the
    optimizer. Gradients the microbatch phase ends with a sum all-reduce
    (parameters entering a tensor-parallel region, e.g. layer norms under
    sequence parallelism) are accumulated unreduced and reduced once in the
    step instead; tied parameters are first all-reduced over their group.
    With `shard-grads` (ZeRO-2) the buffers are `shard_grads`: every
    gradient-producing phase ends each bucket with an accumulating
    reduce-scatter (`dist.bucket_reduce_start {accumulate}` after the
    bucket's last gradient, its wait before the phase's trailing sends),
    returns no gradient, and reduces the sum-all-reduced gradients in
    place; the step takes the shards. With `shard-params` (ZeRO-3) they are
    `shard_params` too.
  }];
  let options = [
    Option<"bucketSize", "bucket-size", "int64_t", "0",
           "elements per bucket (0: Megatron's max(40000000, 1000000 x dp))">,
    Option<"distributedOptimizer", "distributed-optimizer", "bool", "false",
           "ZeRO-1: reduce-scatter each bucket, each dp rank updates its shard">,
    Option<"padBucketsForHighNcclBusbw", "pad-buckets-for-high-nccl-busbw",
           "bool", "false", "pad buckets to lcm(dp, 128, 2^16) elements">,
    Option<"singleBucketGroup", "single-bucket-group", "bool", "false",
           "one bucket group holding every bucket (with overlap-grad-reduce "
           "their reductions start together, once all are complete)">,
    Option<"overlapGradReduce", "overlap-grad-reduce", "bool", "false",
           "start each bucket's all-reduce (reduce-scatter with the "
           "distributed optimizer) in the last microbatch's backward as soon "
           "as its gradients are complete">,
    Option<"shardGrads", "shard-grads", "bool", "false",
           "ZeRO-2 (with distributed-optimizer): keep only this rank's shard "
           "of the gradients; every backward reduce-scatters each bucket as "
           "soon as its gradients are complete and adds its shard in">,
    Option<"shardParams", "shard-params", "bool", "false",
           "ZeRO-3 (with shard-grads): keep only this rank's shard of the "
           "parameters too (the buffers are shard_params)">
  ];
  let dependentDialects = ["::tessera::dist::DistDialect", "::tessera::nn::NNDialect",
                           "::mlir::func::FuncDialect"];
}


def PPSplitPass : Pass<"tessera-pp-split", "mlir::ModuleOp"> {
  let summary = "split the model into pipeline stages (Megatron's layer offsets)";
  let description = [{
    With the mesh's pp > 1, the model function becomes one function per
    (pipeline rank, chunk), `@chunk<c>` in a nested module `@pp<r>` per
    pipeline rank (`dist.pp_rank`), marked `dist.stage = {stage, chunk,
    layers}` with virtual stage = chunk * pp + rank. Layers (the ops'
    `nn.layer` marks) follow Megatron's offsets: contiguous blocks, or with
    vpp chunks, chunk c of rank r from c * L/vpp + r * L/(pp vpp); `pp-layers`
    gives an uneven split (layers per rank), and Megatron's split options
    (`pipeline-model-parallel-layout`, `decoder-first-pipeline-num-layers`,
    `decoder-last-pipeline-num-layers`,
    `account-for-embedding-in-pipeline-split`,
    `account-for-loss-in-pipeline-split`) a count per virtual stage, also
    with vpp and also zero (a stage of the embedding or the loss alone),
    checked as Megatron checks them, with its messages. Unmarked ops before the first
    layer (embedding) go to the first stage, after the last layer (final
    norm, LM head, loss) to the last. A value a later stage uses is sent to
    the next stage (`dist.send` / `dist.recv` with a tag per hop) and passed
    on through the stages between. A parameter used on the first and last
    pipeline rank (the tied embedding) is marked `dist.tied = "embedding"`.
    `v-shape` (the zbv and dualpipev schedules, vpp 2) places virtual
    stage s on rank s for s < pp and on rank 2 pp - 1 - s after: the hop
    at the V's turn stays on the last rank (`peer = "self"`), the second
    chunk's values travel back towards rank 0, and the embedding and the
    loss (and a tied embedding, read by both chunks) are on the first rank.
    With pp = 1 the pass changes nothing.
  }];
  let dependentDialects = ["::tessera::dist::DistDialect", "::mlir::func::FuncDialect"];
  let options = [
    ListOption<"stageLayers", "pp-layers", "int64_t",
               "layers per pipeline rank for an uneven split (e.g. 3,5,5,3)">,
    Option<"layout", "pipeline-model-parallel-layout", "std::string", "\"\"",
           "Megatron's layout string (E, t, L per virtual stage, '|' "
           "between stages)">,
    Option<"firstStageLayers", "decoder-first-pipeline-num-layers",
           "int64_t", "-1", "layers on the first pipeline rank (Megatron's)">,
    Option<"lastStageLayers", "decoder-last-pipeline-num-layers", "int64_t",
           "-1", "layers on the last pipeline rank (Megatron's)">,
    Option<"accountForEmbedding", "account-for-embedding-in-pipeline-split",
           "bool", "false",
           "the embedding counts as a layer of the first virtual stage">,
    Option<"accountForLoss", "account-for-loss-in-pipeline-split", "bool",
           "false", "the loss counts as a layer of the last virtual stage">,
    Option<"vShape", "v-shape", "bool", "false",
           "place the two chunks of each rank as a V (virtual stage s on "
           "rank s, then 2 pp - 1 - s): the zbv and dualpipev schedules">
  ];
}


def PPSchedulePass : Pass<"tessera-pp-schedule", "mlir::ModuleOp"> {
  let summary = "order every pipeline rank's forwards and backwards (Megatron's schedules)";
  let description = [{
    Adds a `dist.schedule` to each pipeline-rank module: `dist.run` of the
    chunks' forward and backward phases per microbatch, in the order of
    `schedule`: `none` (F0 B0 F1 B1 ...), `1f1b` (warmup pp - rank - 1,
    capped at M, then one forward one backward, then cooldown) or
    `interleaved` (Megatron's warmup (pp - rank - 1) * 2 + (vpp - 1) * pp and
    chunk ids; M must be a multiple of pp), `zb-h1`, or the V-shaped
    `zbv` and `dualpipev` (PyTorch's ScheduleZBVZeroBubble and
    ScheduleDualPipeV; vpp 2 placed as a V by tessera-pp-split's
    `v-shape`); `auto` picks interleaved when
    vpp > 1, else 1f1b. M comes from tessera-set-batch. Each forward takes a
    free slot of its chunk (its copy of inputs and saved activations), its
    backward frees it. Gradient sync and the optimizer (the step phase) run
    once after the schedule. Without pipeline ranks the pass does nothing.
  }];
  let dependentDialects = ["::tessera::dist::DistDialect"];
  let options = [
    Option<"schedule", "schedule", "std::string", "\"auto\"",
           "none, 1f1b, interleaved, zb-h1, zbv, dualpipev or auto">
  ];
}

def SplitBackwardPass : Pass<"tessera-split-backward", "mlir::ModuleOp"> {
  let summary = "split each pipeline chunk's backward into input- and weight-gradient phases (zero bubble's B and W)";
  let description = [{
    For the zero-bubble schedules (Qi et al., "Zero Bubble Pipeline
    Parallelism"): each chunk's backward `backward_c<k>` keeps its receives
    and sends and every op a send depends on (B: the input gradient, which
    the previous stage waits for); everything else moves, in order, to a new
    phase `backward_w_c<k>` (`tessera.phase = "backward_w"`, W: the
    parameters' gradients and any bucket reductions), which returns the
    backward's results. A value B computes and W reads is saved in the
    microbatch slot: B returns it as `tessera.stash` (numbered after the
    forward's) and W takes it as an argument, so the slot is held until W.
    A last-microbatch variant (`<name>:last`) becomes W's variant; its
    input-gradient part must equal the plain backward's. Without pipeline
    ranks the pass does nothing.
  }];
  let dependentDialects = ["::tessera::dist::DistDialect", "::mlir::func::FuncDialect"];
}

def TPCommOverlapPass : Pass<"tessera-tp-comm-overlap", "mlir::ModuleOp"> {
  let summary = "pipeline sequence parallelism's all-gathers and reduce-scatters with their GEMMs";
  let description = [{
    Megatron-LM's `--tp-comm-overlap` (TransformerEngine's userbuffers ring
    exchange): under sequence parallelism, a `dist.all_gather` along dim 0
    over "tp" whose result is the rows of an `nn.linear` or `nn.matmul`
    becomes `dist.all_gather_matmul`, and a `dist.reduce_scatter` along dim
    0 over "tp" of such a GEMM's result (its only reader) becomes
    `dist.matmul_reduce_scatter`; the runtime pipelines each with the
    GEMM's blocks of rows around the tp ring. Every phase is rewritten:
    the forward's column-parallel input and row-parallel output, the
    backward's gradient gather before the row-parallel linear's input
    gradient and reduce-scatter after the column-parallel one's, and
    recomputed forwards. A pair whose operands are defined too late (the
    GEMM's weight after the gather's other readers) stays unfused.
    `all-gather=false` and `reduce-scatter=false` (Megatron's
    `--disable-tp-comm-overlap-ag` and `--disable-tp-comm-overlap-rs`) leave
    that kind of collective apart.
  }];
  let dependentDialects = ["::tessera::dist::DistDialect", "::tessera::nn::NNDialect"];
  let options = [
    Option<"allGather", "all-gather", "bool", "true",
           "fuse the all-gathers with the GEMMs that read their rows">,
    Option<"reduceScatter", "reduce-scatter", "bool", "true",
           "fuse the reduce-scatters with the GEMMs whose sums they reduce">
  ];
  let statistics = [
    Statistic<"numGather", "all-gather-matmul", "all-gathers fused with their GEMM">,
    Statistic<"numScatter", "matmul-reduce-scatter", "reduce-scatters fused with their GEMM">
  ];
}

def CastBeforeGatherPass : Pass<"tessera-cast-before-gather", "mlir::ModuleOp"> {
  let summary = "gather the 16-bit rows the GEMMs read, not their f32 source";
  let description = [{
    Under mixed precision a GEMM reads a bf16 (or f16) cast of its f32
    operand; where that operand is a `dist.all_gather` (sequence
    parallelism's gathers before the column-parallel GEMMs, and the
    backward's gradient gathers before the row-parallel ones), the cast
    moves before the gather: an all-gather whose every reader is an
    `nn.cast` to one type becomes the cast of its input, gathered. The
    values are the same (the cast is elementwise), the gather carries half
    the bytes, and the gathered rows are kept in 16 bits, as Megatron-LM's
    bf16 activations are. A parameter bucket's gather (`param_sync`) is not
    touched. tessera-compile runs it after autodiff under `--bf16` and
    `--fp16`.
  }];
  let dependentDialects = ["::tessera::dist::DistDialect", "::tessera::nn::NNDialect"];
  let statistics = [
    Statistic<"numHoisted", "gathers-of-casts", "gathers that now gather their readers' cast">
  ];
}

def GatherParamsPass : Pass<"tessera-gather-params", "mlir::ModuleOp"> {
  let summary = "ZeRO-3: all-gather each parameter bucket right before its readers";
  let description = [{
    For a `shard_params` grad buffer (ZeRO-3: Megatron's
    `--data-parallel-sharding-strategy optim_grads_params`, Megatron-FSDP,
    PyTorch's FSDP), a rank keeps only its shard of each bucket's
    parameters (`pshard:<buffer>:<k>`, updated in place by the step). In
    every phase but the step and init, the ops that read a bucket's
    parameters are cut into runs: a run ends where an op reads parameters
    of other buckets only. Before the first op of each run the phase takes
    the bucket's shard (an argument bound to `pshard:<buffer>:<k>`, added
    once), `dist.all_gather`s it over the buffer's group and `dist.unpack`s
    it; the run's ops read the unpacked parameters. The forward thus
    gathers each bucket once and the backward (the layers in reverse)
    again, while a bucket whose forward and backward readers are adjacent
    (the output layer) is gathered once for both. lower-to-rt makes the
    unpacked parameters views of the gathered bucket, which lives until
    the run's last reader: Megatron-FSDP's gather before a module's
    forward and backward and its resharding after them. The phase keeps
    its parameter arguments, unread, so the artifact still describes each
    parameter (its shape, sharding and initialisation). tessera-compile runs
    it after the backward split, so B and W gather what they read.

    With `prefetch` (tessera-compile's `--overlap-param-gather` under
    ZeRO-3), each gather but a phase's first becomes a
    `dist.all_gather_start` right after the previous gather's unpack and a
    `dist.wait` where the gather was: the next run's bucket travels while
    the current run computes (Megatron-FSDP's and FSDP's prefetch of the
    next module's parameters), two gathered buckets live at a time, and the
    values are the same.
  }];
  let options = [
    Option<"prefetch", "prefetch", "bool", "false",
           "start each run's gather under the previous run (one bucket ahead)">
  ];
  let dependentDialects = ["::tessera::dist::DistDialect", "::mlir::func::FuncDialect"];
}

def VerifySchedulePass : Pass<"tessera-verify-schedule", "mlir::ModuleOp"> {
  let summary = "prove that the pipeline schedule cannot hang";
  let description = [{
    Runs every pipeline rank's instruction stream symbolically (the phases
    in `dist.schedule` order, then the step): consecutive sends and receives
    form one batch, posted together and complete once every op of it has met
    its peer's matching op (rendezvous, the strictest semantics, so a
    schedule that passes cannot hang under any MPI or NCCL buffering).
    A send meets the receive on the peer pipeline rank with the same tag;
    shapes and element types must agree; collectives over groups that span
    pipeline ranks (embedding, pp, ...) must come in the same order on all
    members. A mismatch or a deadlock is an error at the op that would hang,
    with a note at the schedule step that runs it. It also checks the
    schedule itself: each chunk runs forward then backward once per
    microbatch, and a microbatch in flight keeps its slot. The evaluation
    order (tessera-eval-phase's `eval_c<k>` in the order of the schedule's
    forwards, tessera-run --eval-only) is run and checked the same way.
  }];
  let dependentDialects = ["::tessera::dist::DistDialect"];
}

#endif // TESSERA_DIALECTS_DIST_TRANSFORMS_PASSES_TD
