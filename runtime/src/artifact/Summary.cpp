//===- Summary.cpp - human-readable manifest of an artifact ---------------===//
//
// tessera-run --print-summary: header fields, mesh, groups, batch,
// optimizer, and per program its buffers, inputs, functions and schedule.
//
//===----------------------------------------------------------------------===//

#include "tessera/rt/Artifact.h"

#include <map>
#include <sstream>

namespace tessera::rt {

static const char *kindName(fb::BufferKind k) {
  return fb::EnumNameBufferKind(k);
}

std::string summarizeArtifact(const LoadedArtifact &artifact) {
  const fb::Artifact &a = *artifact.root();
  std::ostringstream os;
  os << "artifact: " << artifact.name() << "\n";
  os << "  format version: " << a.format_version() << "\n";
  os << "  producer: " << fbString(a.producer()) << "\n";
  os << "  model: " << fbString(a.model()) << "\n";
  os << "  compile flags: " << fbString(a.compile_flags()) << "\n";
  os << "  world size: " << a.world_size() << "\n";
  os << "  mesh:";
  if (a.mesh())
    for (const fb::MeshAxis *axis : *a.mesh())
      os << " " << fbString(axis->name()) << "=" << axis->size();
  os << " (order " << fbString(a.order()) << ")\n";
  os << "  rank groups:\n";
  std::map<std::string, std::vector<std::string>> groups;
  if (a.groups())
    for (const fb::RankGroup *g : *a.groups()) {
      std::string s = "[";
      if (g->ranks())
        for (flatbuffers::uoffset_t i = 0; i < g->ranks()->size(); ++i)
          s += (i ? "," : "") + std::to_string(g->ranks()->Get(i));
      groups[fbString(g->kind())].push_back(s + "]");
    }
  for (auto &[kind, list] : groups) {
    os << "    " << kind << ":";
    for (auto &s : list)
      os << " " << s;
    os << "\n";
  }
  if (const fb::Batch *b = a.batch())
    os << "  batch: micro " << b->micro_batch_size() << ", global "
       << b->global_batch_size() << ", microbatches " << b->num_microbatches()
       << "\n";
  if (const fb::Optimizer *o = a.optimizer())
    os << "  optimizer: " << fbString(o->kind()) << " lr=" << o->lr()
       << " beta1=" << o->beta1() << " beta2=" << o->beta2()
       << " eps=" << o->eps() << " weight_decay=" << o->weight_decay()
       << " clip_grad=" << o->clip_grad() << "\n";
  if (a.programs())
    for (const fb::Program *p : *a.programs()) {
      os << "  program pp_rank " << p->pp_rank() << ": arena "
         << p->arena_bytes() << " bytes (persistent " << p->persistent_bytes()
         << ")\n";
      os << "    buffers:\n";
      if (p->buffers())
        for (flatbuffers::uoffset_t i = 0; i < p->buffers()->size(); ++i) {
          const fb::Buffer *b = p->buffers()->Get(i);
          os << "      #" << i << " " << fbString(b->name()) << " "
             << kindName(b->kind()) << " " << fb::EnumNameDType(b->dtype())
             << shapeToString(b->shape()) << " @" << b->offset();
          if (b->staged())
            os << " staged";
          if (b->rank_group() && b->rank_group()->size())
            os << " over " << fbString(b->rank_group());
          if (b->global_shape() && b->global_shape()->size())
            os << " global" << shapeToString(b->global_shape());
          if (b->shard_dim() >= 0)
            os << " shard dim " << b->shard_dim() << " over "
               << fbString(b->shard_axis());
          if (b->shard2_dim() >= 0)
            os << " and dim " << b->shard2_dim() << " over "
               << fbString(b->shard2_axis());
          if (b->kind() == fb::BufferKind::Param &&
              b->init() == fb::InitKind::Data) {
            os << " init Data" << shapeToString(b->data_shape());
            if (b->data_file() && b->data_file()->size())
              os << " from " << fbString(b->data_file()) << " in "
                 << fbString(b->data_dir()) << " @" << b->data_offset();
            else
              os << " inline";
          } else if (b->kind() == fb::BufferKind::Param) {
            os << " init " << fb::EnumNameInitKind(b->init()) << "("
               << b->init_scale() << ")";
          }
          if (b->of() >= 0)
            os << " of #" << b->of();
          os << "\n";
        }
      if (p->inputs())
        for (const fb::InputSpec *in : *p->inputs())
          os << "    input " << fbString(in->name()) << " -> #" << in->buffer()
             << (in->num_classes() ? " classes " : "")
             << (in->num_classes() ? std::to_string(in->num_classes()) : "")
             << (in->vocab_size() ? " vocab " : "")
             << (in->vocab_size() ? std::to_string(in->vocab_size()) : "")
             << "\n";
      os << "    loss buffer #" << p->loss_buffer() << ", iteration buffer #"
         << p->iteration_buffer() << "\n";
      if (p->functions())
        for (const fb::Function *f : *p->functions()) {
          os << "    function " << fbString(f->name()) << ": "
             << (f->instrs() ? f->instrs()->size() : 0) << " instructions";
          if (f->chunk() >= 0)
            os << ", chunk " << f->chunk();
          if (f->num_slots() > 0)
            os << ", " << f->num_slots()
               << (f->num_slots() == 1 ? " slot of " : " slots of ")
               << f->slot_bytes() << " bytes @" << f->slot_base();
          os << "\n";
        }
      if (p->schedule() && p->schedule()->size()) {
        os << "    schedule " << fbString(p->schedule_kind()) << " ("
           << p->num_chunks()
           << (p->num_chunks() == 1 ? " chunk, " : " chunks, ")
           << p->schedule()->size() << " steps):";
        const flatbuffers::uoffset_t shown = 32;
        for (flatbuffers::uoffset_t si = 0;
             si < p->schedule()->size() && si < shown; ++si) {
          const fb::ScheduleStep *step = p->schedule()->Get(si);
          int fi = step->function();
          std::string name =
              p->functions() && fi >= 0 && fi < int(p->functions()->size())
                  ? fbString(p->functions()->Get(fi)->name())
                  : "#" + std::to_string(fi);
          os << " " << name << "/mb" << step->microbatch() << "/s"
             << step->slot();
        }
        if (p->schedule()->size() > shown)
          os << " ... (" << p->schedule()->size() - shown << " more)";
        os << "\n";
      }
    }
  return os.str();
}

} // namespace tessera::rt
