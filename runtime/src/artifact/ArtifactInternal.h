//===- ArtifactInternal.h - Between the loader's parts ----------*- C++ -*-===//
//
// What the container reader (Container.cpp) needs of the validator
// (Validator.cpp); not part of the runtime's API.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_ARTIFACT_ARTIFACTINTERNAL_H
#define TESSERA_RT_ARTIFACT_ARTIFACTINTERNAL_H

#include "tessera/rt/Artifact.h"

namespace tessera::rt {

/// Semantic validation of a verified FlatBuffer; errors name `name`.
Status validateArtifact(const std::string &name, const fb::Artifact &artifact);

} // namespace tessera::rt

#endif // TESSERA_RT_ARTIFACT_ARTIFACTINTERNAL_H
