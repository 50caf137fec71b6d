//===- TesseraInterfaces.cpp - Op interfaces shared by dialects -----------===//

#include "tessera/Interfaces/TesseraInterfaces.h"

#include "tessera/Interfaces/TesseraInterfaces.cpp.inc"
